"""``capibus status``'s pure half: consumer names, lease values, the assembly of what Redis and
JetStream said into per-service status with its warnings, and how it is shown."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from cli.render import Style
from cli.status import (
    ConsumerState,
    Observed,
    age,
    as_json,
    assemble,
    holder_of,
    lines,
    ranges,
    split_consumer,
)

NOW = datetime(2026, 11, 28, 6, 0, tzinfo=UTC)
TTL = 6.0


def expires(heartbeat_seconds_ago: float) -> float:
    """A member's score: when the heartbeat it sent that long ago expires."""
    return NOW.timestamp() - heartbeat_seconds_ago + TTL


def consumer(
    name: str, pending: int = 0, ack: int = 0, *, waited: float | None = None
) -> ConsumerState:
    oldest = None if waited is None else NOW - timedelta(seconds=waited)
    return ConsumerState("CAPIBUS_STATUS", name, pending, ack, 0, oldest)


def observed(**fields: object) -> Observed:
    base: dict[str, object] = {
        "now": NOW,
        "partitions": 4,
        "lease_ttl": TTL,
        "members": {},
        "leases": {},
        "consumers": [],
        "dead_letters": {},
    }
    return Observed(**(base | fields))  # type: ignore[arg-type]


# --- names and values -----------------------------------------------------------------------


def test_a_durable_consumer_name_is_service_subscription_partition() -> None:
    assert split_consumer("writer-status-p3") == ("writer", "status", 3)
    assert split_consumer("helm-capiclusters-p15") == ("helm", "capiclusters", 15)
    # A service Redis knows wins over the first hyphen.
    assert split_consumer("ladybug-api-changes-p0", ["ladybug-api"]) == (
        "ladybug-api",
        "changes",
        0,
    )
    assert split_consumer("ladybug-api-changes-p0") == ("ladybug", "api-changes", 0)
    # Ephemeral readers' names are not of that shape.
    assert split_consumer("xYz0AbC123dEfGhI") is None
    assert split_consumer("writer-p3") is None


def test_a_lease_value_names_its_holder_unless_handed_over() -> None:
    assert holder_of("w-a:17") == "w-a"
    assert holder_of("host:with:colons-1:3") == "host:with:colons-1"
    assert holder_of("released:w-a:17") is None
    assert holder_of(None) is None


def test_ranges_fold_runs_and_ages_read_short() -> None:
    assert ranges([0, 1, 2, 5, 7, 8, 9]) == "0-2,5,7-9"
    assert ranges([3]) == "3"
    assert ranges([]) == "-"
    assert [age(s) for s in (None, 0.25, 42, 150, 7200, 3 * 86400)] == [
        "-",
        "0.2s",
        "42s",
        "2m",
        "2h",
        "3d",
    ]


# --- assembly -------------------------------------------------------------------------------


def test_replicas_hold_their_partitions_with_their_heartbeat_ages() -> None:
    seen = observed(
        members={"writer": {"w-a": expires(0.5), "w-b": expires(2.0)}},
        leases={"writer": {0: "w-a:1", 1: "w-b:2", 2: "w-a:3", 3: "w-b:4"}},
        consumers=[consumer(f"writer-status-p{p}") for p in range(4)],
    )
    (writer,) = assemble(seen).services
    assert [(r.name, r.partitions, r.live) for r in writer.replicas] == [
        ("w-a", (0, 2), True),
        ("w-b", (1, 3), True),
    ]
    assert [round(r.heartbeat_age or 0, 3) for r in writer.replicas] == [0.5, 2.0]
    assert writer.unheld == ()
    assert assemble(seen).alerts == ()


def test_lag_adds_up_per_subscription_and_the_oldest_wait_wins() -> None:
    seen = observed(
        members={"writer": {"w-a": expires(1)}},
        leases={"writer": {p: "w-a:1" for p in range(4)}},
        consumers=[
            consumer("writer-status-p0", pending=2, waited=30),
            consumer("writer-status-p1", ack=1, waited=90),
            consumer("writer-meta-p0"),
        ],
    )
    (writer,) = assemble(seen).services
    meta, status = writer.subscriptions
    assert (meta.subscription, meta.pending, meta.ack_pending) == ("meta", 0, 0)
    assert (status.pending, status.ack_pending, status.oldest_unacked_age) == (2, 1, 90.0)
    assert [p.holder for p in status.partitions] == ["w-a", "w-a"]


def test_warnings_name_unheld_partitions_orphaned_work_and_dead_letters() -> None:
    seen = observed(
        members={"helm": {"h-1": expires(1)}, "lease": {"l-1": expires(30)}},
        leases={
            "helm": {0: "h-1:1", 1: "h-1:2", 2: "released:h-1:3"},
            "lease": {},
        },
        consumers=[consumer("helm-clusters-p3", pending=5), consumer("helm-clusters-p2")],
        dead_letters={"lease": 2, "watcher": 0},
    )
    status = assemble(seen)
    assert [s.name for s in status.services] == ["helm", "lease"]
    helm, lease = status.services
    assert helm.unheld == (2, 3)
    assert lease.replicas[0].live is False  # its heartbeat expired 24 s ago
    assert [(a.service, a.text) for a in status.alerts] == [
        ("helm", "partition(s) 2-3 held by no replica"),
        ("helm", "clusters p3: 5 message(s) waiting and no replica holds the partition"),
        ("lease", "no live replica: 4 partition(s) held by none"),
        ("lease", "2 dead letter(s): capibus dlq list --service lease"),
    ]


def test_a_holder_that_stopped_heartbeating_is_still_shown_with_its_partitions() -> None:
    seen = observed(members={"writer": {}}, leases={"writer": {0: "gone:5"}})
    (writer,) = assemble(seen).services
    (replica,) = writer.replicas
    assert (replica.name, replica.partitions, replica.heartbeat_age, replica.live) == (
        "gone",
        (0,),
        None,
        False,
    )


def test_a_service_with_dead_letters_only_is_listed_without_partitions() -> None:
    (watcher,) = assemble(observed(dead_letters={"watcher": 1})).services
    assert (watcher.unheld, watcher.replicas, watcher.dead_letters) == ((), (), 1)


# --- showing it -----------------------------------------------------------------------------


def _two_writers() -> Observed:
    return observed(
        members={"writer": {"w-a": expires(0.5), "w-b": expires(1.5)}},
        leases={"writer": {0: "w-a:1", 1: "w-a:2", 2: "w-b:3"}},
        consumers=[consumer("writer-status-p0", pending=3, waited=12)],
        dead_letters={"writer": 1},
    )


def test_the_table_shows_replicas_lag_totals_and_warnings() -> None:
    text = lines(assemble(_two_writers()), Style(False))
    assert text[0] == "writer: 2 live replica(s), 3/4 partitions held, 1 dead letter(s)"
    assert text[1].split() == ["REPLICA", "PARTITIONS", "HEARTBEAT"]
    assert text[2].split() == ["w-a", "0-1", "0.5s", "ago"]
    assert text[3].split() == ["w-b", "2", "1.5s", "ago"]
    assert text[5].split() == ["status", "status", "3", "0", "0", "12s"]
    assert text[-3].startswith("1 service(s), 2 live replica(s), 3 pending, 0 ack pending")
    assert text[-2:] == [
        "warning: writer: partition(s) 3 held by no replica",
        "warning: writer: 1 dead letter(s): capibus dlq list --service writer",
    ]
    assert all("\033[" not in line for line in text)
    assert any("\033[" in line for line in lines(assemble(_two_writers()), Style(True)))


def test_json_is_one_line_with_replicas_partitions_and_lag() -> None:
    doc = json.loads(as_json(assemble(_two_writers())))
    (writer,) = doc["services"]
    assert [(r["name"], r["partitions"]) for r in writer["replicas"]] == [
        ("w-a", [0, 1]),
        ("w-b", [2]),
    ]
    (status,) = writer["subscriptions"]
    assert status["pending"] == 3
    assert status["partitions"] == [
        {
            "partition": 0,
            "holder": "w-a",
            "pending": 3,
            "ack_pending": 0,
            "redelivered": 0,
            "oldest_unacked_age_seconds": 12.0,
        }
    ]
    assert writer["unheld_partitions"] == [3]
    assert doc["totals"]["dead_letters"] == 1
    assert {w["service"] for w in doc["warnings"]} == {"writer"}
