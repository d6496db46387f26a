"""The Tumblebug stand-in's knobs: ``STANDIN_TUMBLEBUG_*`` environment variables.

Read once, when the process starts (``TumblebugKnobs.from_env``); ``standins/README.md`` lists
them. Flags of ``python -m standins.tumblebug`` override the environment, and
``POST /_standin/faults`` arms the same faults at run time. Basic-auth credentials fall back
to upstream's own variables (``API_USERNAME``/``API_PASSWORD``, read by Tumblebug v0.7.0's
``src/api/rest/server/server.go``), then to ``default``/``default``, what CB-Ladybug sends by
default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "STANDIN_TUMBLEBUG_"
STRICT, COMPAT = "strict", "compat"


@dataclass(frozen=True)
class TumblebugKnobs:
    host: str = "127.0.0.1"
    port: int = 0
    url_file: str | None = None
    username: str = "default"
    password: str = "default"
    namespaces: tuple[str, ...] = ("ns-1",)
    #: ``strict``: ``GET /ns/{ns}`` of an unknown namespace is 404; ``compat``: 200 with a
    #: message and no ``id``, as Tumblebug's handler answers (reference §C.9 quirk 1)
    namespace_mode: str = STRICT
    #: start a real sshd per VM through ``standins.sshnodes.farm.NodeFarm``; off: VMs without sshd
    ssh: bool = True
    nodes_dir: str | None = None
    workload_kubeconfig: str | None = None
    #: VM public IPs: ``address_count`` consecutive loopback addresses from ``address_start``
    address_start: str = "127.0.0.2"
    address_count: int = 253
    #: glob patterns of VM names that come up ``Failed`` (until the faults are cleared)
    failed_vms: tuple[str, ...] = ()
    failed_message: str = "stand-in: the CSP refused to create the VM"
    #: glob patterns of VM names that come up ``Running`` without a public IP
    no_public_ip_vms: tuple[str, ...] = ()
    #: the first N ``DELETE /ns/{ns}/mcis/{id}`` fail with 500 (exercises refine-then-retry)
    mcis_delete_fails: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TumblebugKnobs:
        env = os.environ if environ is None else environ
        default = cls()

        def text(name: str, fallback: str) -> str:
            return env.get(PREFIX + name, "").strip() or fallback

        def optional(name: str) -> str | None:
            return env.get(PREFIX + name, "").strip() or None

        mode = text("NAMESPACE_MODE", default.namespace_mode).lower()
        if mode not in (STRICT, COMPAT):
            raise ValueError(f"{PREFIX}NAMESPACE_MODE must be {STRICT} or {COMPAT}, not {mode}")
        return cls(
            host=text("HOST", default.host),
            port=int(text("PORT", str(default.port))),
            url_file=optional("URL_FILE"),
            username=text("USERNAME", env.get("API_USERNAME", "").strip() or default.username),
            password=text("PASSWORD", env.get("API_PASSWORD", "").strip() or default.password),
            namespaces=_names(text("NAMESPACES", ",".join(default.namespaces))),
            namespace_mode=mode,
            ssh=_flag(text("SSH", "1")),
            nodes_dir=optional("NODES_DIR"),
            workload_kubeconfig=optional("WORKLOAD_KUBECONFIG"),
            address_start=text("ADDRESS_START", default.address_start),
            address_count=int(text("ADDRESS_COUNT", str(default.address_count))),
            failed_vms=_names(text("FAILED_VMS", "")),
            failed_message=text("FAILED_MESSAGE", default.failed_message),
            no_public_ip_vms=_names(text("NO_PUBLIC_IP_VMS", "")),
            mcis_delete_fails=int(text("MCIS_DELETE_FAILS", "0")),
        )


def _names(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _flag(value: str) -> bool:
    return value.lower() not in ("0", "false", "no", "off")
