"""Knobs and fault names shared by the assisted-service, hive and metal3 host stand-ins.

Faults are per object (annotations), not per process, so one stand-in process serves many
tests at once; only the pace is process-wide.

- ``STANDIN_ASSISTED_DELAY``: seconds between reactor steps (default 0.2; 0 for benches);
- annotation ``standins.capibus.dev/assisted-fault`` on a CAPI Cluster: ``iso-never`` (its
  InfraEnvs never get an ISO URL), ``aci-insufficient`` (its AgentClusterInstall stays
  ``insufficient``), ``install-error`` (its install ends in ``error`` after ``installing``);
- annotation ``standins.capibus.dev/fault: mac-mismatch`` on a BareMetalHost (the Agent it
  boots reports a MAC no BareMetalHost has).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from standins.base import Knobs, env_float

ASSISTED_FAULT = "standins.capibus.dev/assisted-fault"
HOST_FAULT = "standins.capibus.dev/fault"

ISO_NEVER = "iso-never"
ACI_INSUFFICIENT = "aci-insufficient"
INSTALL_ERROR = "install-error"
MAC_MISMATCH = "mac-mismatch"


@dataclass
class AssistedKnobs(Knobs):
    """``step_delay`` is ``STANDIN_ASSISTED_DELAY`` here: the pace of every reactor step."""

    step_delay: float = field(default_factory=lambda: env_float("STANDIN_ASSISTED_DELAY", 0.2))
    #: seconds before an InfraEnv whose inputs are missing or wrong is looked at again
    retry: float = 1.0
