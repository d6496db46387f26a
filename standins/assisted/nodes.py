"""The workload cluster's side: its kubeconfig, and the Nodes of hosts that finished installing.

assisted-service writes the installed cluster's admin kubeconfig into the management cluster;
here that kubeconfig is the one of a second API server the stand-in is pointed at
(``--workload-kubeconfig``), so whoever reads the admin kubeconfig Secret reaches a real API
server. When an Agent reaches ``installed`` or ``added-to-existing-cluster`` its host's kubelet
would join that cluster: a Node is created there, named as the host, labelled with the Agent's
``spec.nodeLabels`` (CAPM3 finds a Node by its ``metal3.io/uuid`` label to set its providerID),
and Ready. Deleting the Agent deletes the Node, best effort.

Creating is idempotent (an existing Node is kept, its labels and status brought up to date),
so a restarted stand-in re-asserts the Nodes of every installed Agent it lists.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from shared.errors import CapibusError, KubeConflict, KubeNotFound
from shared.kube import KubeClient, KubeConfig
from shared.resources import NODE
from standins.assisted.shapes import (
    HOST_DONE,
    Json,
    debug_state,
    meta,
    node,
    node_name,
    node_status,
)

log = logging.getLogger("standins.assisted.nodes")


@dataclass
class Workload:
    """The workload API server: its kubeconfig's text and a client for it."""

    kubeconfig: str
    kube: KubeClient

    @classmethod
    def open(cls, path: str | Path) -> Workload:
        text = Path(path).read_text()
        client = KubeClient.from_config(
            KubeConfig.load(path), qps=None, user_agent="capibus-standin-assisted"
        )
        return cls(text, client)

    async def aclose(self) -> None:
        await self.kube.aclose()


class Nodes:
    def __init__(self, workload: Workload) -> None:
        self.kube = workload.kube
        self._registered: dict[str, str] = {}  # agent key -> node name

    async def ensure(self, agent: Json) -> None:
        key = f"{meta(agent)['namespace']}/{meta(agent)['name']}"
        name = node_name(agent)
        if self._registered.get(key) == name:
            return
        wanted = node(agent)
        try:
            await self.kube.create(NODE, wanted)
        except KubeConflict:  # a restart, or the host installed again: bring it up to date
            patch = {"metadata": {"labels": wanted["metadata"]["labels"]}}
            await self.kube.patch_merge(NODE, None, name, patch)
        await self.kube.patch_merge(
            NODE, None, name, {"status": node_status(agent)}, subresource="status"
        )
        self._registered[key] = name
        log.info("node %s ready in the workload cluster (agent %s)", name, key)

    async def drop(self, agent: Json) -> None:
        key = f"{meta(agent)['namespace']}/{meta(agent)['name']}"
        name = self._registered.pop(key, None)
        if name is None:
            if debug_state(agent) not in HOST_DONE:
                return  # never installed: a Node of that name is another host's
            name = node_name(agent)
        try:
            with contextlib.suppress(KubeNotFound):
                await self.kube.delete(NODE, None, name)
        except CapibusError as exc:  # best effort: nothing would retry a gone Agent
            log.warning("node %s: not deleted (%s)", name, exc)
            return
        log.info("node %s deleted (agent %s gone)", name, key)
