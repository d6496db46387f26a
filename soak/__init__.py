"""The fault soak: many Clusters through their lifecycle while a seeded injector breaks things.

capibus promises that under faults it loses nothing, duplicates nothing and converges once
the fault clears. The integration tests show one fault at a time on one Cluster; the soak
shows it Jepsen-style, on a deployment-shaped system (``soak.world``: a three-node JetStream
cluster with three replicas of every stream, two replicas of every consumer service, the
peers as stand-ins), for dozens of Clusters created, scaled, upgraded and deleted while
processes are killed and frozen and servers restarted (``soak.inject``), one fault at a time
so each recovery can be timed. At the end a checker (``soak.checks``, fed by
``soak.observe``) judges the invariants from outside the system, and ``soak.report`` writes
``soak/RESULTS.md``.

Everything random is drawn up front from one seed (``soak.plan``), so a failing run is
repeated by its seed. Run it with ``make soak`` (``SOAK_ARGS="--quick"``,
``"--seed N"``); ``docs/operations.md``, "The fault soak", says how to read the report.
It is a benchmark-like run, not part of ``make test``.
"""
