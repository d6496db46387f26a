"""The API server as Ladybug's store: find, list, create, change and delete LadybugClusters,
and wait for what the provisioner makes of them.

Upstream keeps a Cluster entity in cb-store and its handlers do the provisioning inline; here
the handlers only write the resource and then **wait by watching it**: a watch of the
namespace's LadybugClusters from the object's resourceVersion, filtered to its name and uid,
so the answer comes with the event that settles it, with no polling. A watch that breaks or
expires is followed by a fresh read and a new watch, so a lost event costs a read, never the
answer. The wait is bounded (``Deps.wait_timeout``): ``WaitTimedOut`` carries the object as
last seen so the handler can say which phase it reached.

Spec changes (add-node, remove-node) are JSON patches guarded by a ``test`` of the
resourceVersion the handler decided on: a concurrent change makes the patch fail and the
handler decides again on the fresh object, so two add-node calls never pick one index.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from services.ladybug.api.ports import Deps, Json, KubeApi
from shared.errors import KubeConflict, KubeNotFound, KubeUnavailable, WatchExpired
from shared.models.ladybug import (
    KUBECONFIG_KEY,
    NAMESPACE_LABEL,
    kubeconfig_secret_name,
    object_name,
)
from shared.resources import LADYBUG_CLUSTER, SECRET

log = logging.getLogger(__name__)

#: a broken watch is retried after this long (seconds), after a fresh read
REWATCH_DELAY = 0.5
#: one server-side watch lasts at most this long before it is renewed
WATCH_SECONDS = 300


class AlreadyExists(Exception):
    """Another request created the object first (the API server's create serialises them)."""


class WaitTimedOut(Exception):
    def __init__(self, last: Json | None) -> None:
        super().__init__("timed out")
        self.last = last


class Store:
    def __init__(self, deps: Deps) -> None:
        self.kube: KubeApi = deps.kube
        self.namespace = deps.namespace
        self.timeout = deps.wait_timeout

    async def find(self, namespace: str, cluster: str) -> Json | None:
        try:
            return await self.kube.get(
                LADYBUG_CLUSTER, self.namespace, object_name(namespace, cluster)
            )
        except KubeNotFound:
            return None

    async def in_namespace(self, namespace: str) -> list[Json]:
        """The Tumblebug namespace's clusters, oldest first (upstream lists by key order)."""
        items, _ = await self.kube.list(
            LADYBUG_CLUSTER,
            namespace=self.namespace,
            label_selector=f"{NAMESPACE_LABEL}={namespace}",
        )
        return sorted(items, key=lambda o: (o["metadata"].get("creationTimestamp") or "", _name(o)))

    async def kubeconfig(self, obj: Json) -> str:
        """The admin kubeconfig of ``obj`` from its Secret, "" until the provisioner wrote it."""
        try:
            secret = await self.kube.get(SECRET, self.namespace, kubeconfig_secret_name(_name(obj)))
        except KubeNotFound:
            return ""
        return _secret_value(secret)

    async def kubeconfigs(self, namespace: str) -> dict[str, str]:
        """The admin kubeconfigs of a Tumblebug namespace's clusters, by object name: one list
        of the labelled Secrets (the sshKey Secrets share the label and are skipped)."""
        try:
            secrets, _ = await self.kube.list(
                SECRET, namespace=self.namespace, label_selector=f"{NAMESPACE_LABEL}={namespace}"
            )
        except KubeNotFound:
            return {}
        suffix = kubeconfig_secret_name("")
        found: dict[str, str] = {}
        for secret in secrets:
            name = _name(secret)
            if name.endswith(suffix):
                found[name[: -len(suffix)]] = _secret_value(secret)
        return found

    async def create(self, obj: Json) -> Json:
        try:
            return await self.kube.create(LADYBUG_CLUSTER, obj)
        except KubeConflict as exc:
            raise AlreadyExists(str(exc)) from exc

    async def patch(self, obj: Json, ops: list[Json]) -> Json:
        """Apply ``ops`` if ``obj`` is unchanged since it was read (``KubeConflict`` if not)."""
        meta = obj["metadata"]
        guard = {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": meta["resourceVersion"],
        }
        return await self.kube.patch_json(
            LADYBUG_CLUSTER, self.namespace, meta["name"], [guard, *ops]
        )

    async def delete(self, obj: Json) -> None:
        with contextlib.suppress(KubeNotFound):
            await self.kube.delete(LADYBUG_CLUSTER, self.namespace, _name(obj))

    async def wait(self, obj: Json, done: Callable[[Json | None], bool]) -> Json | None:
        """``obj`` as it is when ``done`` says so (None: gone); ``WaitTimedOut`` after the
        timeout. ``done`` sees None once the object is gone or replaced by another uid."""
        waiter = _Waiter(self.kube, self.namespace, obj, done)
        try:
            async with asyncio.timeout(self.timeout):
                return await waiter.run()
        except TimeoutError:
            raise WaitTimedOut(waiter.last) from None


class _Waiter:
    def __init__(
        self, kube: KubeApi, namespace: str, obj: Json, done: Callable[[Json | None], bool]
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = _name(obj)
        self.uid = obj["metadata"].get("uid")
        self.done = done
        self.last: Json | None = obj

    async def run(self) -> Json | None:
        while True:
            self.last = await self._read()
            if self.done(self.last):
                return self.last
            if self.last is None:
                return None
            try:
                if await self._watch(self.last["metadata"]["resourceVersion"]):
                    return self.last
            except (WatchExpired, KubeUnavailable) as exc:
                log.info("watch of %s ended (%s); reading it again", self.name, exc)
                await asyncio.sleep(REWATCH_DELAY)  # a retry delay, not a poll

    async def _read(self) -> Json | None:
        try:
            obj = await self.kube.get(LADYBUG_CLUSTER, self.namespace, self.name)
        except KubeNotFound:
            return None
        return obj if self._same(obj) else None

    async def _watch(self, resource_version: str) -> bool:
        """Whether an event settled the wait; False when the watch ended without one."""
        events = self.kube.watch(
            LADYBUG_CLUSTER,
            resource_version=resource_version,
            namespace=self.namespace,
            timeout_seconds=WATCH_SECONDS,
        )
        try:
            async for event in events:
                if event.type == "BOOKMARK" or _name(event.object) != self.name:
                    continue
                gone = event.type == "DELETED" or not self._same(event.object)
                self.last = None if gone else event.object
                if self.done(self.last):
                    return True
            return False
        finally:
            # a wait that ends (or times out) mid-stream closes its watch at once
            closing = getattr(events, "aclose", None)
            if closing is not None:
                await closing()

    def _same(self, obj: Json) -> bool:
        return not self.uid or obj["metadata"].get("uid") == self.uid


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _secret_value(secret: Json) -> str:
    value = (secret.get("data") or {}).get(KUBECONFIG_KEY)
    return base64.b64decode(value).decode() if value else ""
