"""Every subject and stream name, and the partitioning that gives each object one owner.

Subjects are hierarchical so a human can filter the bus by kind, partition or object::

    capibus.evt.<kind>.<partition>.<namespace>.<name>     ResourceChanged        (EVENTS)
    capibus.evt.<kind>.listed                             ResourcesListed        (EVENTS)
    capibus.status.patch.<kind>.<partition>.<ns>.<name>  PatchStatus            (STATUS)
    capibus.status.meta.<kind>.<partition>.<ns>.<name>   PatchMetadata          (STATUS)
    capibus.lifecycle.prep.<step>.<partition>.<ns>.<name> PrerequisiteChanged    (LIFECYCLE)
    capibus.lifecycle.reconcile.<partition>.<ns>.<name>   ReconcileCluster       (LIFECYCLE)
    capibus.lifecycle.catalog.<partition>._.<name>        SyncAppTemplate        (LIFECYCLE)
    capibus.lifecycle.recheck.<service>.<p>.<ns>.<name>  RecheckObject          (LIFECYCLE)
    capibus.journal.<what>.<kind>.<namespace>.<name>      what services did      (JOURNAL)
    capibus.dlq.<service>.<original subject>              MessageDeadLettered    (DEADLETTER)

Partitions are how capibus gets per-object exclusivity across replicas. Each object maps to
one of ``partitions`` buckets by a stable hash of its *owning cluster's* key (related objects
such as Machines hash with their Cluster), every (service, partition) pair has its own durable
consumer, and a replica only pulls from partitions it holds a lease on (``shared.coordination``).
So one replica at a time sees all events of one cluster, in stream order. The partition count
is part of the subject layout: every service must agree on it, and changing it means draining
the streams first (``docs/operations.md``).

Names are made subject-safe: a namespace never contains ``.``, so ``_`` stands for
"cluster-scoped"; in names (DNS subdomains, which cannot contain ``_``) ``.`` becomes ``_``.
The message body always carries the exact reference; the subject is for routing and filtering.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import timedelta

PREFIX = "capibus"
CLUSTER_SCOPED = "_"
#: a partition number, or ``ANY_PARTITION`` to describe every partition's filter at once
Partition = int | str
ANY_PARTITION = "*"
#: the subject token of the Azimuth ``Cluster`` kind (``shared.resources.CLUSTER.token``)
AZIMUTH_CLUSTER = "cluster"


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str


EVENTS = StreamSpec(
    "CAPIBUS_EVENTS", (f"{PREFIX}.evt.>",), "Kubernetes changes seen by the watcher"
)
STATUS = StreamSpec(
    "CAPIBUS_STATUS", (f"{PREFIX}.status.>",), "Status and metadata patches for the writer"
)
LIFECYCLE = StreamSpec(
    "CAPIBUS_LIFECYCLE",
    (f"{PREFIX}.lifecycle.>",),
    "Prerequisites settled per Cluster, and requests to look at a Cluster again",
)
JOURNAL = StreamSpec("CAPIBUS_JOURNAL", (f"{PREFIX}.journal.>",), "Side effects services performed")
DEADLETTER = StreamSpec(
    "CAPIBUS_DEADLETTER", (f"{PREFIX}.dlq.>",), "Messages given up on, with why"
)
ALL_STREAMS = (EVENTS, STATUS, LIFECYCLE, JOURNAL, DEADLETTER)

#: JetStream drops a repeated Nats-Msg-Id within this window; two watcher replicas and a
#: restarted watcher's re-list all fall well inside it.
DUPLICATE_WINDOW = timedelta(minutes=10)


def partition_of(key: str, partitions: int) -> int:
    """Stable across processes and Python versions (unlike ``hash``)."""
    return zlib.crc32(key.encode()) % partitions


def namespace_token(namespace: str | None) -> str:
    return namespace or CLUSTER_SCOPED


def name_token(name: str) -> str:
    return name.replace(".", "_")


def _object(namespace: str | None, name: str) -> str:
    return f"{namespace_token(namespace)}.{name_token(name)}"


def resource_event(kind: str, partition: int, namespace: str | None, name: str) -> str:
    return f"{PREFIX}.evt.{kind}.{partition}.{namespace_token(namespace)}.{name_token(name)}"


def resource_listed(kind: str) -> str:
    return f"{PREFIX}.evt.{kind}.listed"


def resource_events_of_kind(kind: str) -> str:
    return f"{PREFIX}.evt.{kind}.*.*.*"


def resource_events_in_partition(kind: str, partition: Partition) -> str:
    return f"{PREFIX}.evt.{kind}.{partition}.*.*"


def status_patch(kind: str, partition: int, namespace: str | None, name: str) -> str:
    """Where a ``PatchStatus`` for one object of ``kind`` (its token) goes."""
    return f"{PREFIX}.status.patch.{kind}.{partition}.{_object(namespace, name)}"


def status_patches_in_partition(partition: Partition) -> str:
    return f"{PREFIX}.status.patch.*.{partition}.*.*"


def metadata_patch(kind: str, partition: int, namespace: str | None, name: str) -> str:
    """Where a ``PatchMetadata`` for one object of ``kind`` (its token) goes."""
    return f"{PREFIX}.status.meta.{kind}.{partition}.{_object(namespace, name)}"


def metadata_patches_in_partition(partition: Partition) -> str:
    return f"{PREFIX}.status.meta.*.{partition}.*.*"


def cluster_status(partition: int, namespace: str, name: str) -> str:
    """``status_patch`` for an Azimuth Cluster (tests, the bench and the demo read these)."""
    return status_patch(AZIMUTH_CLUSTER, partition, namespace, name)


def prerequisite(step: str, partition: int, namespace: str, name: str) -> str:
    return f"{PREFIX}.lifecycle.prep.{step}.{partition}.{namespace}.{name_token(name)}"


def prerequisites_in_partition(partition: Partition) -> str:
    return f"{PREFIX}.lifecycle.prep.*.{partition}.*.*"


def reconcile(partition: int, namespace: str, name: str) -> str:
    return f"{PREFIX}.lifecycle.reconcile.{partition}.{namespace}.{name_token(name)}"


def reconciles_in_partition(partition: Partition) -> str:
    return f"{PREFIX}.lifecycle.reconcile.{partition}.*.*"


def journal(what: str, kind: str, namespace: str | None, name: str) -> str:
    return f"{PREFIX}.journal.{what}.{kind}.{namespace_token(namespace)}.{name_token(name)}"


def dead_letter(service: str, original_subject: str) -> str:
    return f"{PREFIX}.dlq.{service}.{original_subject}"


def object_key(subject: str) -> str:
    """``<namespace>/<name>`` from an object subject (the last two tokens).

    Used only to group messages per object before decoding, so a malformed body still
    lands in the right per-object queue; decoded messages use their ``ref``.
    """
    namespace, name = subject.split(".")[-2:]
    return f"{'' if namespace == CLUSTER_SCOPED else namespace}/{name}"


def app_template_sync(partition: int, name: str) -> str:
    """Where ``SyncAppTemplate`` commands for one (cluster-scoped) AppTemplate go."""
    return f"{PREFIX}.lifecycle.catalog.{partition}.{CLUSTER_SCOPED}.{name_token(name)}"


def app_template_syncs_in_partition(partition: Partition) -> str:
    return f"{PREFIX}.lifecycle.catalog.{partition}.*.*"


def recheck(service: str, partition: int, namespace: str | None, name: str) -> str:
    """Where ``RecheckObject`` commands for ``service`` about one object go."""
    return f"{PREFIX}.lifecycle.recheck.{service}.{partition}.{_object(namespace, name)}"


def rechecks_in_partition(service: str, partition: Partition) -> str:
    return f"{PREFIX}.lifecycle.recheck.{service}.{partition}.*.*"
