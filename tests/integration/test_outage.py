"""Long outages, short: the outage run of ``soak.outage`` with outages of under a minute.

``python -m soak.outage`` stops the API server for 10 minutes and the Zenith registrar and
the chart repository for 30 while Clusters are created, scaled and deleted
(``soak/OUTAGE.md``). This is the same run on the same world (the real local stack, every
service a process of its own, the stand-ins), shortened to fit ``make test``: two Clusters
converged first, then the registrar and the chart repository down for 40 s and the API
server for 20 s in the middle of that, while one Cluster is created, one scaled and one
deleted. What it asserts is what the long run shows: no dead letter, no process exited,
requests to each dead endpoint bounded by the backoff, the wait visible in the helm
service's metrics and the Clusters' status, and convergence once everything is back.
"""

from __future__ import annotations

import pytest

from soak.outage import Config, outage, render

pytestmark = pytest.mark.integration

SHORT = Config(
    apiserver_minutes=20 / 60,
    registrar_minutes=40 / 60,
    clusters=2,
    churn_seconds=20.0,
    converge_minutes=3.0,
    sample_seconds=5.0,
    setup_minutes=3.0,
)
ASSERTED = (
    "no-dead-letter",
    "no-exit",
    "bounded-requests",
    "wait-visible",
    "converged-after",
)


@pytest.mark.timeout(480)
async def test_outages_end_in_convergence_without_dead_letters() -> None:
    record = await outage(SHORT)

    verdicts = {v.name: v for v in record.verdicts}
    failed = [name for name in ASSERTED if not verdicts[name].ok]
    assert not failed, f"{failed} failed:\n{render(record)}"
    assert set(record.windows) == {"apiserver", "registrar", "chartrepo"}
    # the outage was felt: requests were refused, and the helm service waited
    assert sum(r.total for r in record.rates if r.service == "helm"), render(record)
