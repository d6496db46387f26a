"""``capibus``: argument parsing, the subcommands' flow, and the error policy.

Exit codes: 0 done; 1 the request cannot be done as asked (no such dead letter, nothing found,
a purge without ``--yes``, a retried message the server refuses as too large); 2 NATS cannot be
reached, nor Redis (``status``) or the API server (``replay``) (one readable line naming the
URL, never a traceback: a person debugging a stuck cluster needs to know it is the connection,
not the command); 130 on Ctrl-C. The connection is
tried once, with a short timeout, unlike the services, which wait for NATS for ever.

The NATS URL comes from ``--nats-url``, else ``NATS_URL`` / ``CAPIBUS_NATS_URL`` (the services'
own settings variables), else ``nats://127.0.0.1:4222``. Every subcommand prints to stdout only
what it was asked for; progress and errors go to stderr, so piping a listing into a file or
``jq`` gets the listing alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TextIO

from cli import dlq, status, streams
from cli.errors import Unreachable
from cli.render import Style, event_lines, json_line, tree_lines
from cli.story import Filter, Record, causation_tree, merged, object_filters, parse_object
from cli.story import parse_since as since_of
from shared import subjects
from shared.access import CredentialsRejected
from shared.bus import Bus
from shared.errors import BusUnavailable, PermanentError
from shared.settings import transport_security

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
Command = Callable[[argparse.Namespace, Bus], Coroutine[Any, Any, int]]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        return run_services(args)
    try:
        with _quiet_libraries():
            return asyncio.run(_run(args))
    except BusUnavailable as exc:
        _fail(f"cannot reach NATS at {args.nats_url}: {_reason(exc)}")
        return 2
    except (Unreachable, CredentialsRejected) as exc:
        _fail(str(exc))
        return 2
    except (dlq.DlqError, PermanentError, ValueError) as exc:
        _fail(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


def _fail(text: str) -> None:
    print(f"capibus: {text}", file=sys.stderr)


def _reason(exc: BusUnavailable) -> str:
    cause = exc.__cause__
    return str(cause) if cause is not None and str(cause) else str(exc)


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """nats-py logs every failed connection attempt with a traceback; the exit line says it.
    The levels are put back after, for callers running ``main`` in their own process."""
    loggers = [logging.getLogger(name) for name in ("nats", "shared.bus")]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)


async def _run(args: argparse.Namespace) -> int:
    bus = await Bus.connect(
        args.nats_url,
        name="capibus-cli",
        tls=transport_security().context(args.nats_url),
        connect_timeout=args.timeout,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.2,
    )
    try:
        command: Command = args.command
        return await command(args, bus)
    finally:
        await bus.close()


# --- events ---------------------------------------------------------------------------------


async def events(args: argparse.Namespace, bus: Bus) -> int:
    namespace, name = parse_object(args.object)
    keep = Filter.of(
        since_of(args.since) if args.since else None, args.kind, args.type, args.service
    )
    readers = [
        streams.Reader(bus, stream, filters, keep.since)
        for stream, filters in object_filters(namespace, name).items()
    ]
    try:
        opened = [r for r in readers if await r.open()]
        backlog = await asyncio.gather(*(r.backlog(_progress(args)) for r in opened))
        _clear_progress(args)
        story = merged(backlog, keep)
        _emit(args, story, header=True)
        if args.follow:
            await _follow(args, opened, keep, header=not story)
        elif not story and not args.json:
            print(f"no messages about {args.object}", file=sys.stderr)
    finally:
        await asyncio.gather(*(r.close() for r in readers))
    return 0


async def _follow(
    args: argparse.Namespace, readers: list[streams.Reader], keep: Filter, *, header: bool
) -> None:
    """New messages as they are stored, until Ctrl-C (arrival order across streams); the
    table's header comes with the first row when the backlog printed none."""
    queue: asyncio.Queue[Record] = asyncio.Queue()

    async def pump(reader: streams.Reader) -> None:
        while True:
            for rec in await reader.fetch(100, wait=1.0):
                queue.put_nowait(rec)

    tasks = [asyncio.create_task(pump(r)) for r in readers]
    try:
        while True:
            rec = await queue.get()
            if keep.keeps(rec):
                _emit(args, [rec], header=header)
                header = False
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _emit(args: argparse.Namespace, records: Sequence[Record], *, header: bool) -> None:
    out = sys.stdout
    if args.json:
        lines = [json_line(r) for r in records]
    elif records:
        lines = event_lines(records, Style.for_stream(out, args.color), header=header)
    else:
        lines = []
    for line in lines:
        print(line, file=out, flush=True)


# --- trace ----------------------------------------------------------------------------------


async def trace(args: argparse.Namespace, bus: Bus) -> int:
    since = since_of(args.since) if args.since else None
    if args.object:
        scope = object_filters(*parse_object(args.object))
    else:
        scope = {spec.name: list(spec.subjects) for spec in subjects.ALL_STREAMS}
    found = await asyncio.gather(
        *(streams.read(bus, s, f, since, _progress(args)) for s, f in scope.items())
    )
    _clear_progress(args)
    lines = causation_tree([r for batch in found for r in batch], args.message_id)
    if not lines:
        _fail(f"no message with id {args.message_id} (widen --since or drop --object?)")
        return 1
    if args.json:
        for line in lines:
            print(f'{{"depth":{line.depth},"record":{json_line(line.record)}}}')
    else:
        for text in tree_lines(lines, Style.for_stream(sys.stdout, args.color)):
            print(text)
    return 0


# --- dlq ------------------------------------------------------------------------------------


async def dlq_list(args: argparse.Namespace, bus: Bus) -> int:
    found = await dlq.entries(bus, args.service, args.subject)
    if args.json:
        for rec in found:
            print(json_line(rec))
    elif found:
        for line in dlq.list_lines(found, Style.for_stream(sys.stdout, args.color)):
            print(line)
    else:
        print("no dead letters", file=sys.stderr)
    return 0


async def dlq_show(args: argparse.Namespace, bus: Bus) -> int:
    entry = await dlq.entry(bus, args.sequence)
    if args.json:
        print(entry.model_dump_json())
    else:
        print("\n".join(dlq.show_lines(args.sequence, entry)))
    return 0


async def dlq_retry(args: argparse.Namespace, bus: Bus) -> int:
    for sequence in args.sequences:
        print(dlq.retried_line(await dlq.retry(bus, sequence, purge=args.purge)))
    return 0


async def dlq_purge(args: argparse.Namespace, bus: Bus) -> int:
    if not args.yes:
        doomed = await _doomed(args, bus)
        _fail(f"would delete {doomed} dead letter(s); run again with --yes to delete them")
        return 1
    done = await dlq.purge(bus, sequences=args.sequences, every=args.all, service=args.service)
    print("purged " + ("the chosen dead letters" if done is None else f"{len(done)}: {done}"))
    return 0


async def _doomed(args: argparse.Namespace, bus: Bus) -> int:
    if args.sequences:
        return len(args.sequences)
    if not args.all and args.service is None:
        raise dlq.DlqError("say which: sequences, --service NAME or --all")
    return len(await dlq.entries(bus, args.service))


# --- progress on long reads -----------------------------------------------------------------


def _progress(args: argparse.Namespace) -> streams.Progress:
    """A progress line on stderr for reads of more than one batch, when stderr is a terminal."""
    err: TextIO = sys.stderr
    if args.json or not err.isatty():
        return lambda _s, _d, _t: None

    def show(stream: str, done: int, total: int) -> None:
        if total > 500:
            err.write(f"\rreading {stream}: {done}/{total}\033[K")
            err.flush()

    return show


def _clear_progress(args: argparse.Namespace) -> None:
    if not args.json and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")


# --- arguments ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="capibus", description="Read what capibus's services keep on NATS JetStream."
    )
    top.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL") or os.environ.get("CAPIBUS_NATS_URL", DEFAULT_NATS_URL),
        help="NATS server (default: $NATS_URL, else %(default)s)",
    )
    top.add_argument("--timeout", type=float, default=2.0, help="connect timeout, seconds")
    sub = top.add_subparsers(required=True, metavar="COMMAND")
    _events_parser(sub)
    _trace_parser(sub)
    _dlq_parser(sub)
    _status_parser(sub)
    _replay_parser(sub)
    _run_parser(sub)
    return top


def _run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run services in this process against the cluster, NATS and Redis of the "
        "environment (KUBECONFIG, NATS_URL, REDIS_URL)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every default service")
    which.add_argument("--only", metavar="A,B", help="these services, e.g. writer,lease")
    p.set_defaults(command=None)


def run_services(args: argparse.Namespace) -> int:
    """``capibus run``: becomes ``python -m services run`` (the all-in-one process).

    The command replaces itself with the services' own entry point rather than importing
    them: ``cli`` never imports a service, and the process that runs is exactly the one the
    demo, the chart and ``python -m services run`` start, with its signals and exit codes.
    Without ``--all`` or ``--only``, ``CAPIBUS_SERVICES`` chooses, as there.
    """
    argv = [sys.executable, "-m", "services", "run"]
    argv += ["--all"] if args.all else ["--only", args.only] if args.only else []
    os.execv(sys.executable, argv)
    return 0  # not reached: execv replaces the process or raises OSError


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line, for scripts")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: only on a terminal and without NO_COLOR",
    )


def _events_parser(sub: Any) -> None:
    p = sub.add_parser("events", help="one object's story across every stream, in time order")
    p.add_argument("object", help="<namespace>/<name> (/<name> for cluster-scoped)")
    p.add_argument("--since", help="e.g. 10m, 2h, 1d, or an ISO time")
    p.add_argument("--kind", action="append", default=[], help="object kind (repeatable)")
    p.add_argument("--type", action="append", default=[], help="message type (repeatable)")
    p.add_argument("--service", action="append", default=[], help="producer (repeatable)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new messages")
    _output_options(p)
    p.set_defaults(command=events)


def _trace_parser(sub: Any) -> None:
    p = sub.add_parser("trace", help="the causation tree around one message id")
    p.add_argument("message_id")
    p.add_argument("--object", help="search only this <namespace>/<name>'s messages (faster)")
    p.add_argument("--since", help="search only messages since, e.g. 1h")
    _output_options(p)
    p.set_defaults(command=trace)


def _dlq_parser(sub: Any) -> None:
    p = sub.add_parser("dlq", help="dead letters: list, show, retry, purge")
    cmds = p.add_subparsers(required=True, metavar="ACTION")
    ls = cmds.add_parser("list", help="every dead letter, oldest first")
    ls.add_argument("--service", help="only those this service gave up on")
    ls.add_argument("--subject", help="glob on the original subject, e.g. 'capibus.evt.*'")
    _output_options(ls)
    ls.set_defaults(command=dlq_list)
    show = cmds.add_parser("show", help="one dead letter with its reason and payload")
    show.add_argument("sequence", type=int)
    _output_options(show)
    show.set_defaults(command=dlq_show)
    retry = cmds.add_parser("retry", help="publish the original again (new message id)")
    retry.add_argument("sequences", type=int, nargs="+")
    retry.add_argument("--purge", action="store_true", help="delete the dead letter after")
    retry.set_defaults(command=dlq_retry)
    purge = cmds.add_parser("purge", help="delete dead letters (needs --yes)")
    purge.add_argument("sequences", type=int, nargs="*")
    purge.add_argument("--service", help="all of this service's")
    purge.add_argument("--all", action="store_true", help="every dead letter")
    purge.add_argument("--yes", action="store_true", help="really delete")
    purge.set_defaults(command=dlq_purge)


def _status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="replicas, partitions held, lag and dead letters per service")
    p.set_defaults(command=status.command, **status.defaults())
    p.add_argument(
        "--redis-url",
        help="Redis of the leases (default: $REDIS_URL, else redis://127.0.0.1:6379/0)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        help="partitions per stream (default: $CAPIBUS_PARTITIONS, else 16)",
    )
    p.add_argument(
        "--lease-ttl",
        type=float,
        help="lease TTL in seconds, for heartbeat ages (default: $CAPIBUS_LEASE_TTL, else 6)",
    )
    _output_options(p)


async def replay(args: argparse.Namespace, bus: Bus) -> int:
    # Imported when run: the replay engine loads the service's code, which no other
    # subcommand needs (cli/replay.py says why cli may import it at all).
    from cli import replay as replaying  # noqa: PLC0415

    return await replaying.command(args, bus)


def _replay_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay", help="an object's stored messages through a service's handlers, nothing written"
    )
    p.add_argument("object", help="<namespace>/<name> (/<name> for cluster-scoped)")
    p.add_argument(
        "--service", required=True, help="whose handlers: helm, identity, lease, monitor, writer"
    )
    p.add_argument("--since", help="only messages since, e.g. 10m, 2h, 1d, or an ISO time")
    p.add_argument("--kubeconfig", help="the API server read (default: $KUBECONFIG)")
    _output_options(p)
    p.set_defaults(command=replay)
