"""The only door to the Kubernetes API: a small async REST client over httpx.

Why not kubernetes_asyncio: capibus needs a handful of verbs on arbitrary kinds (list, watch,
get, JSON merge patch, server-side apply), and two of that library's defaults are traps we would
have to wrap anyway: a dict patch body on a custom resource is sent as JSON *Patch* unless
``_content_type`` is forced, and a watch that hits 410 Gone retries once with the stale
resourceVersion before raising. Here every patch names its content type and a 410 is one typed
exception, ``WatchExpired``, that the watcher answers by re-listing.

Every httpx error and HTTP failure is translated into ``shared.errors`` at this boundary.
Requests other than watches pass a token bucket, so a burst of work cannot flood the API
server (client-go's QPS/burst, which kubernetes_asyncio lacks).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from shared.errors import (
    KubeConflict,
    KubeExpired,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeTooLarge,
    KubeUnavailable,
    PermanentError,
    retry_after,
    transient_http_status,
)
from shared.ratelimit import TokenBucket
from shared.transport import http_transport

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

Json = dict[str, Any]


#: Asks the API server for a ``PartialObjectMetadata`` instead of the whole object.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class WatchExpired(Exception):
    """The resourceVersion we watch from was compacted away; the caller must re-list."""


@dataclass(frozen=True)
class ResourceKind:
    """One API resource, and the short token that names it in subjects."""

    token: str
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how we prove who we are."""

    server: str
    token: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure: bool = False

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> KubeConfig:
        """``path``, else ``$KUBECONFIG``, else the in-cluster service account."""
        path = path or os.environ.get("KUBECONFIG")
        if path:
            return cls.from_kubeconfig(Path(path))
        return cls.in_cluster()

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        return cls(
            server=f"https://{host}:{port}",
            token=(SERVICE_ACCOUNT_DIR / "token").read_text().strip(),
            ca_file=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        )

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeConfig:
        doc = yaml.safe_load(path.read_text())
        context_name = doc.get("current-context") or doc["contexts"][0]["name"]
        context = _named(doc["contexts"], context_name)["context"]
        cluster = _named(doc["clusters"], context["cluster"])["cluster"]
        user = _named(doc.get("users", []), context.get("user", ""), default={"user": {}})["user"]
        return cls(
            server=cluster["server"].rstrip("/"),
            token=user.get("token"),
            ca_file=_file_or_data(path, cluster, "certificate-authority"),
            client_cert_file=_file_or_data(path, user, "client-certificate"),
            client_key_file=_file_or_data(path, user, "client-key"),
            insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if self.insecure:
            return False
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.client_cert_file:
            context.load_cert_chain(self.client_cert_file, self.client_key_file)
        return context


def _named(items: list[Json], name: str, default: Json | None = None) -> Json:
    for item in items:
        if item.get("name") == name:
            return item
    if default is not None:
        return default
    raise ValueError(f"kubeconfig has no entry named {name!r}")


def _file_or_data(kubeconfig: Path, section: Mapping[str, Any], key: str) -> str | None:
    """Resolve ``key`` (a path relative to the kubeconfig) or ``key-data`` (inline base64)."""
    if section.get(key):
        return str((kubeconfig.parent / section[key]).resolve())
    data = section.get(f"{key}-data")
    if not data:
        return None
    # ssl wants files; the temp file lives as long as the process, like client-go's.
    with tempfile.NamedTemporaryFile("wb", prefix="capibus-", suffix=".pem", delete=False) as f:
        f.write(base64.b64decode(data))
    return f.name


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Json

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


@dataclass
class KubeClient:
    """Async client for the verbs capibus uses; build with ``KubeClient.from_config``."""

    http: httpx.AsyncClient
    limiter: TokenBucket | None = None
    watch_idle_timeout: float = 70.0
    user_agent: str = "capibus"
    max_in_flight: int = 16
    _closed: bool = field(default=False, init=False)
    _slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.max_in_flight)

    @classmethod
    def from_config(
        cls,
        config: KubeConfig,
        *,
        qps: float | None = 50.0,
        burst: int = 100,
        max_in_flight: int = 16,
        timeout: float = 30.0,
        watch_idle_timeout: float = 70.0,
        user_agent: str = "capibus",
    ) -> KubeClient:
        """``max_in_flight`` bounds concurrent requests (watches excluded): a burst of work for
        hundreds of objects then reuses a few warm connections instead of opening hundreds of
        TLS connections, which costs more CPU than the requests themselves."""
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        transport = http_transport(
            verify=config.ssl_context(),
            # Requests hold at most max_in_flight connections; every watch holds one more.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=max_in_flight),
        )
        http = httpx.AsyncClient(
            base_url=config.server,
            headers=headers,
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )
        limiter = TokenBucket(rate=qps, burst=burst) if qps else None
        return cls(
            http=http,
            limiter=limiter,
            watch_idle_timeout=watch_idle_timeout,
            max_in_flight=max_in_flight,
        )

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> Json:
        headers = {"Content-Type": content_type} if body is not None else {}
        if accept:
            headers["Accept"] = accept
        async with self._slots:
            if self.limiter:
                await self.limiter.acquire()
            try:
                response = await self.http.request(
                    method, path, params=_params(params), content=body, headers=headers
                )
            except httpx.HTTPError as exc:
                raise KubeUnavailable(f"{method} {path}: {exc!r}") from exc
        _raise_for_status(response, f"{method} {path}")
        result: Json = response.json()
        return result

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        return await self.request("GET", kind.path(namespace, name))

    async def get_metadata(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        """The object's metadata only: a Secret's data never reaches the caller's memory."""
        return await self.request("GET", kind.path(namespace, name), accept=METADATA_ONLY)

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[Json], str]:
        """All items (paged) and the list's resourceVersion, the point to watch from."""
        items: list[Json] = []
        params: dict[str, str | int | bool] = {"limit": page_size}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", kind.path(namespace), params=params)
            items.extend(page.get("items", []))
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, str(page["metadata"]["resourceVersion"])
            params["continue"] = token

    async def watch(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events after ``resource_version`` until the server closes the stream.

        The stream ends normally after ``timeout_seconds`` and raises ``KubeUnavailable`` when
        nothing (not even a bookmark) arrived for ``watch_idle_timeout`` seconds: a silent
        watch may be a dead connection. A compacted resourceVersion raises ``WatchExpired``.
        """
        params: dict[str, str | int | bool] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        timeout = httpx.Timeout(30.0, read=self.watch_idle_timeout)
        request = self.http.build_request(
            "GET", kind.path(namespace), params=params, timeout=timeout
        )
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise KubeUnavailable(f"watch {kind.plural}: {exc!r}") from exc
        try:
            if response.status_code == 410:
                raise WatchExpired(f"{kind.plural} at {resource_version}")
            if response.is_error:
                await response.aread()
                _raise_for_status(response, f"watch {kind.plural}")
            async for line in response.aiter_lines():
                if line:
                    yield _watch_event(json.loads(line), kind)
        except httpx.HTTPError as exc:
            raise KubeUnavailable(f"watch {kind.plural}: {exc!r}") from exc
        finally:
            await response.aclose()

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        path = kind.path(namespace, name) + (f"/{subresource}" if subresource else "")
        body = json.dumps(patch).encode()
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def apply(
        self,
        kind: ResourceKind,
        obj: Json,
        *,
        field_manager: str,
        force: bool = True,
        subresource: str | None = None,
    ) -> Json:
        """Server-side apply: we own exactly the fields ``obj`` names."""
        meta = obj["metadata"]
        path = kind.path(meta.get("namespace"), meta["name"])
        path += f"/{subresource}" if subresource else ""
        params: dict[str, str | int | bool] = {"fieldManager": field_manager, "force": force}
        body = json.dumps(obj).encode()
        return await self.request("PATCH", path, params=params, body=body, content_type=APPLY_PATCH)

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        namespace = obj["metadata"].get("namespace")
        return await self.request("POST", kind.path(namespace), body=json.dumps(obj).encode())

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        return await self.request("DELETE", kind.path(namespace, name))


def _params(params: Mapping[str, str | int | bool] | None) -> dict[str, str] | None:
    if params is None:
        return None
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}


def _watch_event(raw: Json, kind: ResourceKind) -> WatchEvent:
    if raw.get("type") == "ERROR":
        status = raw.get("object", {})
        if status.get("code") == 410:
            raise WatchExpired(f"{kind.plural}: {status.get('message', 'gone')}")
        raise KubeUnavailable(f"watch {kind.plural} error: {status.get('message', status)}")
    return WatchEvent(type=raw["type"], object=raw["object"])


def _raise_for_status(response: httpx.Response, what: str) -> None:
    if not response.is_error:
        return
    message = _status_message(response)
    code = response.status_code
    text = f"{what}: {code} {message}"
    if code == 404:
        raise KubeNotFound(text)
    if code == 409:
        raise KubeConflict(text, delay=0.1)
    if code in (401, 403):
        raise KubeForbidden(text, reason="Forbidden")
    if code in (400, 422):
        raise KubeInvalid(text, reason="Invalid")
    if code == 410:
        raise KubeExpired(text)
    if code == 413:
        # The API server answers etcd's "request is too large" with 413 as well.
        raise KubeTooLarge(text)
    if transient_http_status(code):
        raise KubeUnavailable(text, delay=retry_after(response.headers.get("Retry-After")))
    raise PermanentError(text, reason=f"HTTP{code}")


def _status_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text[:500]


def kubeconfig_client(text: str, **options: Any) -> KubeClient:
    """A client for the kubeconfig in ``text``, e.g. a CAPI ``<cluster>-kubeconfig`` Secret.

    Inline certificates and keys are written to a scratch directory only while the SSL context
    loads them, so a service building one client per tenant cluster (and a new one whenever a
    kubeconfig rotates) leaves nothing behind on disk, unlike ``KubeConfig.from_kubeconfig``.
    File references are used as they are. ``options`` go to ``KubeClient.from_config``.
    A kubeconfig that cannot be read is a ``PermanentError``: the same text never will be.
    """
    with tempfile.TemporaryDirectory(prefix="capibus-kubeconfig-") as scratch:
        try:
            config = _config_from_text(text, Path(scratch))
            return KubeClient.from_config(config, **options)
        except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError, OSError) as exc:
            # OSError covers ssl.SSLError: certificate data that does not load.
            raise PermanentError(f"unusable kubeconfig: {exc!r}", reason="Kubeconfig") from exc


def _config_from_text(text: str, scratch: Path) -> KubeConfig:
    doc = yaml.safe_load(text)
    context_name = doc.get("current-context") or doc["contexts"][0]["name"]
    context = _named(doc["contexts"], context_name)["context"]
    cluster = _named(doc["clusters"], context["cluster"])["cluster"]
    user = _named(doc.get("users") or [], context.get("user", ""), default={"user": {}})["user"]
    return KubeConfig(
        server=str(cluster["server"]).rstrip("/"),
        token=user.get("token"),
        ca_file=_scratch_file(scratch, cluster, "certificate-authority"),
        client_cert_file=_scratch_file(scratch, user, "client-certificate"),
        client_key_file=_scratch_file(scratch, user, "client-key"),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
    )


def _scratch_file(scratch: Path, section: Mapping[str, Any], key: str) -> str | None:
    if section.get(key):
        return str(section[key])
    data = section.get(f"{key}-data")
    if not data:
        return None
    path = scratch / key
    path.write_bytes(base64.b64decode(data))
    return str(path)
