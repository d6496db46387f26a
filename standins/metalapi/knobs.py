"""The metal-api stand-in's knobs: ``STANDIN_METALAPI_*`` environment variables.

Read once, when the process starts (``MetalApiKnobs.from_env``); ``standins/README.md`` lists
them. Flags of ``python -m standins.metalapi`` override the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "STANDIN_METALAPI_"


@dataclass(frozen=True)
class MetalApiKnobs:
    host: str = "127.0.0.1"
    port: int = 0
    url_file: str | None = None
    #: the shared HMAC key; None switches authentication off
    hmac: str | None = None
    #: seconds an X-Date stays acceptable (metal-stack/security's default lifetime)
    hmac_lifetime: float = 15.0
    pool_size: int = 32
    #: seconds from allocation to ``Phoned Home``; 0 answers the allocation already provisioned
    provisioning_delay: float = 0.5
    #: seconds from a free (``Planned Reboot``) to ``Waiting``
    reboot_delay: float = 0.5
    #: whether ``allocation.succeeded`` turns true on ``Phoned Home`` (real metal-api: never)
    succeeded_on_phoned_home: bool = True
    #: seed of the random pick among waiting machines; None: a fresh one per process
    seed: int | None = None
    projects: tuple[str, ...] = ("00000000-0000-0000-0000-000000000000",)
    partition: str = "vagrant"
    external_network: str = "internet-vagrant-lab"
    external_prefix: str = "185.1.2.0/24"
    super_network: str = "tenant-super-network-vagrant"
    super_prefix: str = "10.0.0.0/16"
    child_length: int = 22
    size: str = "v1-small-x86"
    machine_image: str = "ubuntu-cloud-init-20.04"
    firewall_image: str = "firewall-ubuntu-2.0"
    workload_kubeconfig: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MetalApiKnobs:
        env = os.environ if environ is None else environ
        default = cls()

        def text(name: str, fallback: str) -> str:
            return env.get(PREFIX + name, "").strip() or fallback

        def optional(name: str) -> str | None:
            return env.get(PREFIX + name, "").strip() or None

        seed = optional("SEED")
        projects = [p.strip() for p in text("PROJECTS", ",".join(default.projects)).split(",")]
        return cls(
            host=text("HOST", default.host),
            port=int(text("PORT", str(default.port))),
            url_file=optional("URL_FILE"),
            hmac=optional("HMAC"),
            hmac_lifetime=float(text("HMAC_LIFETIME", str(default.hmac_lifetime))),
            pool_size=int(text("POOL_SIZE", str(default.pool_size))),
            provisioning_delay=float(text("PROVISIONING_DELAY", str(default.provisioning_delay))),
            reboot_delay=float(text("REBOOT_DELAY", str(default.reboot_delay))),
            succeeded_on_phoned_home=_flag(text("ALLOCATION_SUCCEEDED", "1")),
            seed=int(seed) if seed is not None else None,
            projects=tuple(p for p in projects if p),
            partition=text("PARTITION", default.partition),
            external_network=text("EXTERNAL_NETWORK", default.external_network),
            external_prefix=text("EXTERNAL_PREFIX", default.external_prefix),
            super_network=text("SUPER_NETWORK", default.super_network),
            super_prefix=text("SUPER_PREFIX", default.super_prefix),
            child_length=int(text("CHILD_LENGTH", str(default.child_length))),
            size=text("SIZE", default.size),
            machine_image=text("MACHINE_IMAGE", default.machine_image),
            firewall_image=text("FIREWALL_IMAGE", default.firewall_image),
            workload_kubeconfig=optional("WORKLOAD_KUBECONFIG"),
        )


def _flag(value: str) -> bool:
    return value.lower() not in ("0", "false", "no", "off")
