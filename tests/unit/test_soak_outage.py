"""The outage run's arithmetic: the backoff's bounds, a tap's counts, the verdicts' rules."""

from __future__ import annotations

import asyncio
import contextlib

from soak.checks import Facts, Intent, Revision
from soak.outage import Window, burst, deleted_at_most, judged, rate, watched_kinds
from soak.plan import Step
from soak.taps import Tap


def test_burst_counts_the_tries_of_a_capped_doubling_backoff() -> None:
    # tries at 0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5; the next at 63.5
    assert burst(60.0, 60.0) == 7
    assert burst(0.0, 60.0) == 1
    # capped at 30 s: 31.5, then 61.5
    assert burst(62.0, 30.0) == 8
    assert burst(62.0, 60.0) == 7


def test_a_tap_counts_refusals_per_minute_and_in_the_busiest_60_seconds() -> None:
    tap = Tap("helm -> registrar", "127.0.0.1", 1)
    tap.refused = [100.0, 101.0, 159.0, 170.0, 230.0, 400.0]
    assert tap.per_minute(100.0, 250.0) == [3, 1, 1]
    assert tap.max_window(100.0, 250.0) == 3
    assert tap.max_window(150.0, 250.0) == 2


def test_the_rate_is_bounded_per_thing_retrying_and_settles_at_the_cap() -> None:
    tap = Tap("helm -> chartrepo", "127.0.0.1", 1)
    start = 1000.0
    # two objects: their first minute of backoff, then once a minute each
    first = [start + t for t in (0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5)] * 2
    later = [start + 63.5 + 60 * n + d for n in range(5) for d in (0.0, 1.0)]
    tap.refused = sorted(first + later)
    found = rate("helm", "chartrepo", tap, Window("chartrepo", start, start + 400.0), retrying=2)
    assert found.max_minute == 14
    assert found.bound == 14
    assert found.settled == 2
    assert found.settled_bound == 2
    assert found.ok


def test_a_retry_loop_without_backoff_is_unbounded() -> None:
    tap = Tap("watcher -> apiserver", "127.0.0.1", 1)
    start = 0.0
    tap.refused = [start + n * 0.1 for n in range(3000)]
    found = rate("watcher", "apiserver", tap, Window("apiserver", start, start + 300.0), retrying=3)
    assert not found.ok


def test_the_watchers_loops_are_its_kinds_listed() -> None:
    log = "cluster: listed at 12 (0 known)\nsecret: listed at 14 (3 known)\ncluster: listed at 99\n"
    assert watched_kinds(log) == 2


async def test_a_tap_relays_while_up_and_counts_and_resets_while_down() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = int(upstream.sockets[0].getsockname()[1])
    tap = await Tap("test", "127.0.0.1", port).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        writer.write(b"ping")
        assert await reader.read(100) == b"ping"
        writer.close()
        upstream.close()
        await upstream.wait_closed()
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        with contextlib.suppress(ConnectionError):
            assert await reader.read(100) == b""
        writer.close()
        assert len(tap.refused) == 1
        assert tap.carried == 1
    finally:
        await tap.close()


def test_a_cluster_that_began_waiting_in_the_minute_before_may_still_be_in_its_burst() -> None:
    tap = Tap("helm -> registrar", "127.0.0.1", 1)
    start = 0.0
    # one object at its cap all along, then a new Cluster at 190 s: two subscriptions in
    # their first minute of backoff
    steady = [start + 60.0 * n for n in range(6)]
    fresh = [190.0 + t for t in (0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5)] * 2
    tap.refused = sorted(steady + fresh)
    window = Window("registrar", start, start + 330.0)
    assert not rate("helm", "registrar", tap, window, retrying=3).ok
    assert rate("helm", "registrar", tap, window, retrying=3, starts=[190.0]).ok


def _revision(number: int, values: str, description: str = "Install complete") -> Revision:
    return Revision(number, "deployed", description, values)


def test_a_cluster_deleted_before_it_was_installed_needs_no_revision_or_reservation() -> None:
    live, gone = Intent("live"), Intent("gone")
    for intent in (live, gone):
        intent.apply(Step(intent.name, "create", count=2), first="a", second="b")
    gone.apply(Step("gone", "scale", count=3), first="a", second="b")
    gone.apply(Step("gone", "delete"), first="a", second="b")
    facts = Facts(
        revisions={"live": [_revision(1, "x")]},
        subdomains={"live": "s-live", "gone": "s-gone"},
        reservations={"s-live": 1},
        oidc_clients={"live": 1},
        platforms={"live": 1},
    )
    verdicts = {v.name: v for v in judged([live, gone], facts)}
    assert verdicts["helm-revisions"].ok
    assert verdicts["one-of-each"].ok
    assert verdicts["deleted-at-most"].ok


def test_a_deleted_cluster_still_has_at_most_one_revision_per_change() -> None:
    gone = Intent("gone")
    gone.apply(Step("gone", "create", count=2), first="a", second="b")
    gone.apply(Step("gone", "delete"), first="a", second="b")
    twice = [_revision(1, "x"), _revision(2, "x", "Upgrade complete")]
    facts = Facts(revisions={"gone": twice}, subdomains={"gone": "s"}, reservations={"s": 2})
    problems = deleted_at_most([gone], facts).problems
    assert len(problems) == 3, problems
