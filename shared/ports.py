"""What a service may ask of the Kubernetes API and of the bus, as narrow Protocols.

A service states its dependencies by picking from these (``class KubeApi(KubeReader,
KubeWriter, Protocol): ...``) instead of restating ``KubeClient``'s or ``Bus``'s signatures:
one place to change when a verb changes, and one shape for the tests' fakes to follow.
``shared.kube.KubeClient`` and ``shared.bus.Bus`` satisfy them structurally; mypy checks that
wherever a composition root passes them in.

The Protocols name intent, not the adapter's every option: ``list`` has no ``page_size`` (paging
is the adapter's business), and nothing here takes a path, a content type or a status code.
Errors are ``shared.errors`` types: a missing object or kind is ``KubeNotFound``, a lost race
``KubeConflict``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from shared.bus import Published
from shared.kube import JsonPatch, ResourceKind, WatchEvent
from shared.messages import Message

Json = dict[str, Any]


class KubeLister(Protocol):
    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        limit: int | None = None,
    ) -> tuple[list[Json], str]:
        """The items and the list's resourceVersion; ``limit`` stops after that many."""
        ...


class KubeGetter(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...


class KubeReader(KubeGetter, KubeLister, Protocol): ...


class KubeMergePatcher(Protocol):
    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        """RFC 7386; ``metadata.uid``/``resourceVersion`` in ``patch`` are preconditions."""
        ...


class KubeWriter(KubeMergePatcher, Protocol):
    async def create(self, kind: ResourceKind, obj: Json) -> Json: ...

    async def apply(
        self,
        kind: ResourceKind,
        obj: Json,
        *,
        field_manager: str,
        force: bool = True,
        subresource: str | None = None,
    ) -> Json:
        """Server-side apply: the caller owns exactly the fields ``obj`` names."""
        ...

    async def patch_json(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        ops: JsonPatch,
        *,
        subresource: str | None = None,
    ) -> Json:
        """RFC 6902; a ``test`` op that fails raises ``KubeConflict``."""
        ...

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...


class KubeWatcher(KubeLister, Protocol):
    """List, then watch from the list's resourceVersion; ``WatchExpired`` means list again."""

    def watch(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]: ...


class Discovery(Protocol):
    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        """``kind`` as served (plural, version, scope); ``KubeNotFound`` if it is not."""
        ...


class Publisher(Protocol):
    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published: ...


class StreamReader(Protocol):
    async def last_message(self, stream: str, subject: str) -> bytes | None:
        """The last message stored on ``subject`` in ``stream``, or None."""
        ...
