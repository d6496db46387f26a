"""``capibus`` against a real NATS of its own (the stack's pinned nats-server): messages
published the way the services publish them (``shared.bus``, ``StatusReporter``, the
consumer's own dead-letter entry), read back by the command run in-process (``main`` in a
thread, since it runs its own event loop) and once as the installed console script.

Every test works on its own object name and its own dead-lettering service name, so the
module's streams never make one test see another's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from cli import streams
from cli.main import main
from shared import subjects, tracing
from shared.bus import Bus
from shared.consumer import _dead_letter_entry, _Work
from shared.errors import PermanentError
from shared.messages import (
    Condition,
    Message,
    ObjectRef,
    ResourceChanged,
    StatusWritten,
)
from shared.status import StatusReporter
from testenv.harness import ensure_binaries, free_ports
from tests.integration.support import read_stream

pytestmark = pytest.mark.integration

CONSOLE_SCRIPT = Path(sys.executable).with_name("capibus")


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server of this module's own (the stack's pinned binary, JetStream on).

    The command is tested with messages no service would publish (undecodable bodies, events
    of objects that do not exist, dead letters and their retries on the services' subjects):
    on the session's NATS they would reach the services other modules start afterwards."""
    (port,) = free_ports(1)
    store = tmp_path_factory.mktemp("cli-nats")
    binary = ensure_binaries() / "nats-server"
    args = [str(binary), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None, "nats-server exited"
            assert time.monotonic() < deadline, "nats-server did not start in 30 s"
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connection = await Bus.connect(nats_url, name="cli-tests")
    await connection.ensure_streams()
    yield connection
    await connection.close()


class Run:
    """``capibus`` in-process against the module's NATS: exit code, stdout, stderr."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, ["--nats-url", self.url, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    async def json(self, *args: str) -> list[dict[str, Any]]:
        code, out, err = await self(*args, "--json")
        assert code == 0, err
        return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def capibus(nats_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(nats_url, capsys)


def cluster(namespace: str, name: str) -> ObjectRef:
    return ObjectRef(
        api_version="azimuth.stackhpc.com/v1alpha1",
        kind="Cluster",
        namespace=namespace,
        name=name,
        uid=str(uuid.uuid4()),
    )


async def changed(bus: Bus, ref: ObjectRef, size: int = 0) -> tuple[str, ResourceChanged, int]:
    """A watcher-like ResourceChanged; ``size`` pads the object to make a large body."""
    event = ResourceChanged(
        source="watcher/w1",
        correlation_id=f"cluster:{ref.key}",
        event="ADDED",
        ref=ref,
        resource_version="7",
        object={"metadata": {"name": ref.name}, "spec": {"pad": "x" * size}},
    )
    subject = subjects.resource_event("cluster", 2, ref.namespace, ref.name)
    published = await bus.publish(subject, event)
    return subject, event, published.sequence


async def story(bus: Bus, ref: ObjectRef) -> list[Message]:
    """One object's event, the helm service's status patch for it, and the writer's record."""
    _, event, _ = await changed(bus, ref)
    reporter = StatusReporter(bus, partitions=16, source="helm/h1")
    subject, patch = reporter.status(
        ref,
        patch={"phase": "Reconciling"},
        conditions=[Condition(type="HelmReleaseReady", status="False", reason="Installing")],
        cause=event,
    )
    await bus.publish(subject, patch)
    written = StatusWritten(
        source="writer/x1",
        **patch.caused(),
        ref=ref,
        update_ids=[patch.id],
        resource_version="8",
        writer="x1",
        started=patch.time,
        finished=patch.time,
    )
    await bus.publish(subjects.journal("status", "cluster", ref.namespace, ref.name), written)
    return [event, patch, written]


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def dead_letter(bus: Bus, subject: str, sequence: int, service: str) -> int:
    """The dead letter ``shared.consumer`` writes for the message at ``sequence`` after a
    ``PermanentError``: its own entry function on the real delivered message, its own subject
    and message id. Returns the dead letter's stream sequence."""
    msg = await _delivered(bus, subjects.EVENTS.name, subject, sequence)
    work = _Work(msg=msg, sequence=sequence, deliveries=1)
    exc = PermanentError("values do not render")
    entry = _dead_letter_entry(service, subjects.EVENTS.name, work, exc, "PermanentError")
    # As the consumer does: the letter carries its original's trace (here a made-up one).
    with tracing.continuing({"traceparent": TRACEPARENT}):
        published = await bus.publish(
            subjects.dead_letter(service, subject), entry, msg_id=f"dlq:{service}:events:{sequence}"
        )
    return published.sequence


async def _delivered(bus: Bus, stream: str, subject: str, sequence: int) -> Any:
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=sequence,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=10.0,
    )
    psub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    try:
        (msg,) = await psub.fetch(1, timeout=5)
        return msg
    finally:
        await psub.unsubscribe()


def ids(lines: list[dict[str, Any]]) -> list[str]:
    return [line["message"]["id"] for line in lines]


async def test_events_tells_one_objects_story_in_time_order(bus: Bus, capibus: Run) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:6]}"
    ref = cluster(namespace, "demo.one")  # a dot in the name: the subject token is demo_one
    messages = await story(bus, ref)
    await story(bus, cluster(namespace, "other"))

    lines = await capibus.json("events", f"{namespace}/demo.one")
    assert ids(lines) == [m.id for m in messages]
    assert [line["stream"] for line in lines] == [
        "CAPIBUS_EVENTS",
        "CAPIBUS_STATUS",
        "CAPIBUS_JOURNAL",
    ]

    patches = await capibus.json("events", f"{namespace}/demo.one", "--service", "helm")
    assert ids(patches) == [messages[1].id]
    typed = await capibus.json("events", f"{namespace}/demo.one", "--type", "StatusWritten")
    assert ids(typed) == [messages[2].id]
    assert await capibus.json("events", f"{namespace}/demo.one", "--since", "2030-01-01") == []

    code, out, _ = await capibus("events", f"{namespace}/demo.one")
    assert code == 0
    assert "\033[" not in out  # captured stdout is no terminal: plain text
    assert out.splitlines()[0].split() == ["TIME", "STREAM", "TYPE", "SOURCE", "SUBJECT", "DETAILS"]
    assert "HelmReleaseReady=False(Installing)" in out


async def test_follow_prints_what_is_stored_later(bus: Bus, nats_url: str) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:6]}"
    ref = cluster(namespace, "live")
    first = (await story(bus, ref))[0]
    proc = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT),
        "--nats-url",
        nats_url,
        "events",
        f"{namespace}/live",
        "--follow",
        "--json",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        seen = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 10)) for _ in range(3)]
        assert seen[0]["message"]["id"] == first.id
        _, later, _ = await changed(bus, ref)
        line = json.loads(await asyncio.wait_for(proc.stdout.readline(), 10))
        assert line["message"]["id"] == later.id
    finally:
        proc.terminate()
        await proc.wait()


async def test_trace_shows_what_caused_a_message_and_what_it_caused(bus: Bus, capibus: Run) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:6]}"
    event, patch, written = await story(bus, cluster(namespace, "traced"))

    lines = await capibus.json("trace", patch.id, "--object", f"{namespace}/traced")
    assert [(line["depth"], line["record"]["message"]["id"]) for line in lines] == [
        (0, event.id),
        (1, patch.id),
        (2, written.id),
    ]
    code, out, _ = await capibus("trace", patch.id)  # every stream, no --object
    assert code == 0
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["ResourceChanged", event.id],
        ["*", "PatchStatus"],
        ["StatusWritten", written.id],
    ]
    code, _, err = await capibus("trace", str(uuid.uuid4()), "--object", f"{namespace}/traced")
    assert code == 1
    assert "no message with id" in err


@pytest.mark.parametrize("size", [0, 70 * 1024], ids=["whole", "truncated"])
async def test_dlq_retry_brings_the_original_back_under_a_new_id(
    bus: Bus, capibus: Run, size: int
) -> None:
    service = f"svc{uuid.uuid4().hex[:6]}"
    ref = cluster(f"cli-{uuid.uuid4().hex[:6]}", "stuck")
    subject, original, sequence = await changed(bus, ref, size)
    letter = await dead_letter(bus, subject, sequence, service)

    (listed,) = await capibus.json("dlq", "list", "--service", service)
    assert listed["sequence"] == letter
    assert listed["message"]["payload_truncated"] is (size > 0)
    code, out, _ = await capibus("dlq", "show", str(letter))
    assert code == 0
    assert "PermanentError: values do not render" in out
    assert subject in out

    purge = ["--purge"] if size else []  # once keeping the letter, once deleting it
    code, out, err = await capibus("dlq", "retry", str(letter), *purge)
    assert code == 0, err
    assert ("dead letter purged" in out) is bool(purge)
    stored = [m for _, m in await read_stream(bus, subjects.EVENTS.name, subject)]
    assert len(stored) == 2
    again = stored[1]
    records = await streams.read(bus, subjects.EVENTS.name, [subject])
    assert records[-1].trace_id == TRACEPARENT.split("-")[1]  # the retry continues the trace
    assert isinstance(again, ResourceChanged)
    assert again.id != original.id
    assert again.object == original.object
    left = await capibus.json("dlq", "list", "--service", service)
    if purge:  # trace: original, retry
        assert (again.causation_id, left) == (original.id, [])
    else:  # trace: original, dead letter, retry
        assert again.causation_id == listed["message"]["id"]
        assert [line["sequence"] for line in left] == [letter]
        tree = await capibus.json("trace", original.id, "--object", ref.key)
        assert [line["depth"] for line in tree] == [0, 1, 2]


async def test_dlq_purge_needs_yes(bus: Bus, capibus: Run) -> None:
    service = f"svc{uuid.uuid4().hex[:6]}"
    for name in ("a", "b"):
        subject, _, sequence = await changed(bus, cluster(f"cli-{uuid.uuid4().hex[:6]}", name))
        await dead_letter(bus, subject, sequence, service)

    code, _, err = await capibus("dlq", "purge", "--service", service)
    assert code == 1
    assert "would delete 2 dead letter(s)" in err
    assert len(await capibus.json("dlq", "list", "--service", service)) == 2

    code, _, _ = await capibus("dlq", "purge", "--service", service, "--yes")
    assert code == 0
    assert await capibus.json("dlq", "list", "--service", service) == []


async def test_dlq_list_sees_the_letters_of_a_real_undecodable_message(
    bus: Bus, capibus: Run
) -> None:
    service = f"svc{uuid.uuid4().hex[:6]}"
    subject = subjects.resource_event("cluster", 1, "cli-raw", uuid.uuid4().hex[:6])
    ack = await bus.js.publish(subject, b"{not json", headers={"Nats-Msg-Id": str(uuid.uuid4())})
    letter = await dead_letter(bus, subject, ack.seq, service)

    code, out, err = await capibus("dlq", "retry", str(letter))
    assert code == 0, err
    raw = await bus.js.get_last_msg(subjects.EVENTS.name, subject)
    assert raw.data == b"{not json"
    assert raw.headers["Capibus-Retry-Of"] == f"{subjects.DEADLETTER.name}:{letter}"
    assert f"retried #{letter}" in out


def test_unreachable_nats_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "--nats-url", "nats://127.0.0.1:1", "dlq", "list"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "capibus: cannot reach NATS at nats://127.0.0.1:1: "
        "nats: no servers available for connection"
    ]
