"""Lease settings: the shared ones plus ``CAPIBUS_LEASE__*``.

The section is named after the schedule operator's ``Lease``. It does not collide with the
shared ``lease_ttl`` (``CAPIBUS_LEASE_TTL``, the *partition* lease of ``shared.coordination``):
nested settings are read only from ``CAPIBUS_LEASE__<field>``, with two underscores.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.resources import AZIMUTH
from shared.settings import ServiceSettings


class LeaseTuning(BaseModel):
    finalizer: str = Field(
        AZIMUTH,
        min_length=1,
        description="Finalizer held on an adopted Lease until its Cluster API cluster is gone",
    )
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )


class LeaseSettings(ServiceSettings):
    lease: LeaseTuning = LeaseTuning()
