"""The helm stand-in (``standins/helmbin.py``) answers what ``shared.helm`` parses.

The benchmark runs the helm service against the stand-in instead of the real binary, so the
stand-in must not drift from the adapter: here ``shared.helm.Helm`` itself drives the
stand-in (in process, through ``Helm``'s executor seam, releases kept in memory), and every
decision ``ensure_release`` takes (install, no change, upgrade, the repairs of a stuck
release, uninstall) and every document it reads is checked against what Helm would do.
The executable wrapper is run once as a real process.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.helm import (
    Chart,
    ChartRef,
    Completed,
    Helm,
    HelmFailed,
    ReleaseNotFound,
    classify,
    release_selector,
)
from standins import helmbin
from standins.helmbin import Command, Helmbin, HelmbinError, Knobs

Json = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "standins" / "charts" / "openstack-cluster"
CHART = ChartRef(str(CHART_DIR))
NS = "tenant-a"


class MemoryStore:
    """Secrets in memory, matched by label selector as the API server matches them."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], Json] = {}

    def list(self, namespace: str, selector: str) -> list[Json]:
        wanted = dict(part.split("=", 1) for part in selector.split(","))
        return [
            copy.deepcopy(s)
            for (ns, _), s in self.secrets.items()
            if ns == namespace and wanted.items() <= s["metadata"]["labels"].items()
        ]

    def create(self, namespace: str, secret: Json) -> None:
        key = (namespace, secret["metadata"]["name"])
        if key in self.secrets:
            raise HelmbinError(f'secrets "{key[1]}" already exists')
        self.secrets[key] = copy.deepcopy(secret)

    def replace(self, namespace: str, secret: Json) -> None:
        self.secrets[(namespace, secret["metadata"]["name"])] = copy.deepcopy(secret)

    def delete(self, namespace: str, name: str) -> None:
        self.secrets.pop((namespace, name), None)

    def names(self) -> Sequence[str]:
        return sorted(name for _, name in self.secrets)

    def doc(self, name: str) -> Json:
        return helmbin.decode_release(self.secrets[(NS, name)])


class Rig:
    """The stand-in behind ``shared.helm.Helm``'s executor, and what it was asked."""

    def __init__(self, knobs: Knobs | None = None) -> None:
        self.store = MemoryStore()
        self.slept: list[tuple[str, float]] = []
        self.commands: list[str] = []
        self.knobs = knobs or Knobs(latency=1.5, read_latency=0.25)
        self.bin = Helmbin(lambda _: self.store, self.knobs, sleep=self._sleep)
        self.helm = Helm(
            executable="helm",
            kubeconfig="/k",
            executor=self._execute,
            home="/tmp/capibus-unit-helm",
        )

    def _sleep(self, seconds: float) -> None:
        self.slept.append((self.commands[-1], seconds))

    async def _execute(self, argv: Sequence[str], stdin: bytes | None, _: float) -> Completed:
        self.commands.append(Command.parse(argv[1:]).verb)
        answer = self.bin.run(argv[1:], stdin or b"")
        return Completed(answer.code, answer.stdout, answer.stderr)

    def run(self, *argv: str, stdin: bytes = b"") -> helmbin.Answer:
        self.commands.append(Command.parse(argv).verb)
        return self.bin.run(argv, stdin)

    def stuck(self, name: str, status: str, revision: int = 1) -> None:
        """A revision left in ``status``, as a helm killed mid-command leaves it."""
        doc = {
            "name": name,
            "namespace": NS,
            "version": revision,
            "info": {"status": status, "description": "killed"},
            "chart": {"metadata": {"name": "openstack-cluster", "version": "0.27.0-standin"}},
            "config": {"v": "stuck"},
        }
        self.store.create(NS, helmbin.release_secret(doc, now=0))


# --- ensure_release end to end -------------------------------------------------------------------


async def test_a_first_install_is_one_command_and_a_release_helm_would_store() -> None:
    rig = Rig()
    outcome = await rig.helm.ensure_release("one", NS, CHART, {"a": 1}, absent=True)
    assert (outcome.revision, outcome.status, outcome.action) == (1, "deployed", "installed")
    assert rig.commands == ["upgrade"]
    (secret,) = rig.store.list(NS, release_selector("one"))
    meta = secret["metadata"]
    assert meta["name"] == "sh.helm.release.v1.one.v1"
    assert secret["type"] == "helm.sh/release.v1"
    assert {k: meta["labels"][k] for k in ("owner", "name", "status", "version")} == {
        "owner": "helm",
        "name": "one",
        "status": "deployed",
        "version": "1",
    }
    doc = helmbin.decode_release(secret)
    assert doc["config"] == {"a": 1}
    assert doc["chart"]["metadata"]["version"] == "0.27.0-standin"


async def test_the_install_waits_its_latency_once_with_the_pending_record_stored() -> None:
    rig = Rig()
    seen: list[str] = []
    rig.bin.sleep = lambda s: seen.append(
        rig.store.list(NS, "owner=helm")[0]["metadata"]["labels"]["status"]
    )
    await rig.helm.ensure_release("one", NS, CHART, {}, absent=True)
    assert seen == ["pending-install"]


async def test_the_same_chart_and_values_change_nothing() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {"a": [1, 2]}, absent=True)
    rig.commands.clear()
    outcome = await rig.helm.ensure_release("one", NS, CHART, {"a": [1, 2]})
    assert outcome.action == "unchanged"
    assert rig.commands == ["get metadata", "show chart", "get values"]
    assert rig.store.names() == ["sh.helm.release.v1.one.v1"]


async def test_changed_values_upgrade_and_supersede() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {"a": 1}, absent=True)
    outcome = await rig.helm.ensure_release("one", NS, CHART, {"a": 2})
    assert (outcome.revision, outcome.status, outcome.action) == (2, "deployed", "upgraded")
    history = await rig.helm.history("one", NS)
    assert [(r.revision, r.status, r.chart_name, r.chart_version) for r in history] == [
        (1, "superseded", "openstack-cluster", "0.27.0-standin"),
        (2, "deployed", "openstack-cluster", "0.27.0-standin"),
    ]
    assert await rig.helm.values("one", NS, 1) == {"a": 1}


async def test_empty_values_read_back_as_none_given() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {}, absent=True)
    assert rig.run("get", "values", "one", "-n", NS, "-o", "json").stdout == "null\n"
    assert (await rig.helm.ensure_release("one", NS, CHART, {})).action == "unchanged"


@pytest.mark.parametrize("status", ["pending-install", "uninstalling"])
async def test_a_stuck_install_is_uninstalled_then_installed(status: str) -> None:
    rig = Rig()
    rig.stuck("one", status)
    outcome = await rig.helm.ensure_release("one", NS, CHART, {"a": 1})
    assert outcome.action == "recovered+installed"
    assert rig.commands == ["get metadata", "uninstall", "upgrade"]
    assert rig.store.names() == ["sh.helm.release.v1.one.v1"]
    assert rig.store.doc("sh.helm.release.v1.one.v1")["info"]["status"] == "deployed"


async def test_a_stuck_upgrade_is_rolled_back_then_upgraded() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {"a": 1}, absent=True)
    rig.stuck("one", "pending-upgrade", revision=2)
    outcome = await rig.helm.ensure_release("one", NS, CHART, {"a": 3})
    assert outcome.action == "recovered+upgraded"
    assert "rollback" in rig.commands
    statuses = [(r.revision, r.status) for r in await rig.helm.history("one", NS)]
    assert statuses == [(1, "superseded"), (2, "superseded"), (3, "superseded"), (4, "deployed")]
    assert await rig.helm.values("one", NS, 3) == {"a": 1}  # the rollback's: revision 1's


async def test_installing_over_a_pending_release_is_helms_temporary_error() -> None:
    rig = Rig()
    rig.stuck("one", "pending-install")
    answer = rig.run("upgrade", "--install", "one", str(CHART_DIR), "-n", NS, "-o", "json")
    assert answer.code == 1
    error = classify(answer.stderr)
    assert isinstance(error, HelmFailed)
    assert "another operation" in str(error)


async def test_a_missing_release_is_helms_not_found() -> None:
    rig = Rig()
    assert await rig.helm.status("none", NS) is None
    assert await rig.helm.history("none", NS) == []
    assert await rig.helm.uninstall("none", NS) is False
    answer = rig.run("get", "values", "none", "-n", NS, "-o", "json", "--revision", "1")
    assert isinstance(classify(answer.stderr), ReleaseNotFound)


async def test_uninstall_removes_every_revision() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {"a": 1}, absent=True)
    await rig.helm.ensure_release("one", NS, CHART, {"a": 2})
    assert await rig.helm.uninstall("one", NS) is True
    assert rig.store.names() == []


async def test_history_max_prunes_the_oldest_revisions() -> None:
    rig = Rig()
    helm = Helm(
        kubeconfig="/k", executor=rig._execute, history_max=2, home="/tmp/capibus-unit-helm"
    )
    for value in range(4):
        await helm.ensure_release("one", NS, CHART, {"a": value}, absent=value == 0)
    assert rig.store.names() == ["sh.helm.release.v1.one.v3", "sh.helm.release.v1.one.v4"]


async def test_status_reads_the_latest_revision() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {"a": 1}, absent=True)
    current = await rig.helm.status("one", NS)
    assert current is not None
    assert (current.revision, current.status, current.chart_name) == (
        1,
        "deployed",
        "openstack-cluster",
    )
    assert current.app_version == "0.27.0"


async def test_charts_are_read_as_helm_reads_them() -> None:
    rig = Rig()
    assert await rig.helm.show_chart(CHART) == Chart(
        "openstack-cluster", "0.27.0-standin", "0.27.0"
    )
    repo = ChartRef("openstack-cluster", repo="https://charts.example.test", version="0.27.0")
    assert await rig.helm.show_chart(repo) == Chart("openstack-cluster", "0.27.0", None)
    assert await rig.helm.template(CHART, "one", NS, {"a": 1}) == []
    missing = rig.run("show", "chart", "/no/such/chart")
    assert missing.code == 1
    assert "not found" in missing.stderr


async def test_latencies_go_to_writes_and_reads() -> None:
    rig = Rig()
    await rig.helm.ensure_release("one", NS, CHART, {"a": 1}, absent=True)
    await rig.helm.ensure_release("one", NS, CHART, {"a": 1})
    await rig.helm.uninstall("one", NS)
    assert rig.slept == [
        ("upgrade", 1.5),
        ("get metadata", 0.25),
        ("show chart", 0.25),
        ("get values", 0.25),
        ("uninstall", 1.5),
    ]


def test_the_record_names_the_replica_and_each_start_and_end(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    rig = Rig(Knobs(record=str(record), replica="helm-1"))
    rig.run("upgrade", "--install", "one", str(CHART_DIR), "-n", NS, "-o", "json", "--values", "-")
    rig.run("get", "metadata", "missing", "-n", NS, "-o", "json")
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(x["event"], x["verb"], x["release"], x["outcome"]) for x in lines] == [
        ("start", "upgrade", "one", None),
        ("end", "upgrade", "one", "ok"),
        ("start", "get metadata", "missing", None),
        ("end", "get metadata", "missing", "exit 1"),
    ]
    assert {x["replica"] for x in lines} == {"helm-1"}


def test_command_lines_parse_as_shared_helm_writes_them() -> None:
    command = Command.parse(
        ["upgrade", "--install", "r", "chart", "-n", "ns", "--history-max", "3", "--values", "-"]
    )
    assert (command.verb, command.release, command.namespace) == ("upgrade", "r", "ns")
    assert command.flag("--history-max") == "3"
    assert command.flag("--values") == "-"
    assert Command.parse(["get", "metadata", "r", "-o", "json"]).release == "r"
    assert Command.parse(["show", "chart", "c"]).release is None
    assert Command.parse(["uninstall", "r", "--namespace=x"]).namespace == "x"


# --- the executable -------------------------------------------------------------------------------


def test_the_wrapper_runs_the_stand_in_as_a_program(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    wrapper = helmbin.write_wrapper(tmp_path / "helm", latency=0.0, record=record)
    shown = subprocess.run(
        [str(wrapper), "show", "chart", str(CHART_DIR)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["name"] == "openstack-cluster"
    unreachable = subprocess.run(
        [str(wrapper), "get", "metadata", "r", "-n", NS, "-o", "json", "--kubeconfig", "/nowhere"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("Error: Kubernetes cluster unreachable")
    assert len(record.read_text().splitlines()) == 4
