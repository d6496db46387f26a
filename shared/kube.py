"""The only door to the Kubernetes API: a small async REST client over httpx.

Every httpx error and HTTP failure is translated into ``shared.errors`` at this boundary, and
the protocol stays here: services name a kind and an object, never a path, a content type or a
status code (``shared.ports`` lists what they may ask for).

- **Patches name their content type**: JSON merge patch, server-side apply, or RFC 6902 JSON
  Patch (``patch_json``). A JSON Patch whose ``test`` fails is ``KubeConflict``: kube-apiserver
  answers it with the same bare 422 as any patch it cannot apply ("the server rejected our
  request due to an error in our request", reason Invalid, no details: the json-patch error
  text is dropped by ``NewGenericServerResponse``, k8s.io/apiserver/pkg/endpoints/handlers/
  patch.go, verified on kube-apiserver 1.34), so on a 422 the object is read again and the
  ``test`` ops checked against it: if one fails there, the object changed meanwhile.
- **Discovery** (``resolve``): a kind's plural, preferred version and scope come from the API
  server, cached per client. A served kind is remembered for the client's life (a CRD cannot
  rename its plural); an unserved one raises ``KubeNotFound`` and is remembered for
  ``discovery_miss_seconds``, so a CRD installed later is found without one request per event.
- **Watches**: a 410 is one typed exception, ``WatchExpired``, that the caller answers by
  re-listing.
- **Tokens rotate**: an in-cluster (or ``tokenFile``) bearer token is read again once the last
  read is 50 s old, as client-go does (k8s.io/client-go/transport/token_source.go: a
  one-minute period less a 10 s leeway); projected service-account tokens are rewritten by the
  kubelet and the old one expires.
- **Rate**: requests other than watches pass a token bucket (client-go's QPS/burst), so a burst
  of work cannot flood the API server, and at most ``max_in_flight`` are in flight.
- **Traced**: each request is a client span named by its method and path template
  (``path_template``: namespace and name as placeholders), made by the shared transport.

Why hand-written rather than kubernetes_asyncio (checked against its 35.0.1): capibus needs a
handful of verbs on arbitrary kinds, and that library's defaults are traps we would have to
wrap anyway. ``ApiClient.select_header_content_type`` (kubernetes_asyncio/client/api_client.py)
sends a dict patch body on a custom resource as JSON *Patch* unless ``_content_type`` is forced;
``Watch`` (kubernetes_asyncio/watch/watch.py) retries a 410 once with the stale
resourceVersion before raising; and it has no client-side QPS limiter. Re-check this decision
if it picks merge patch for a dict body on custom resources and gains a client-side rate
limiter: then generated, typed clients would cost less than keeping this module.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import json
import math
import os
import ssl
import tempfile
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
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
    WatchExpired,
    retry_after,
    transient_http_status,
)
from shared.ratelimit import TokenBucket
from shared.transport import http_transport

__all__ = [  # WatchExpired lives in shared.errors; watchers have always found it here too
    "Json",
    "JsonPatch",
    "KubeClient",
    "KubeConfig",
    "ResourceKind",
    "TokenFileAuth",
    "WatchEvent",
    "WatchExpired",
    "kubeconfig_client",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
_JSON_PATCH_HEADERS = {"Content-Type": JSON_PATCH}
# A connection that broke under a request: the server never answered it.
_BROKEN_CONNECTION = (httpx.ReadError, httpx.RemoteProtocolError)
_REPEATABLE = frozenset({"GET", "HEAD"})
#: client-go re-reads a token file after its one-minute period less a 10 s leeway
TOKEN_MAX_AGE_SECONDS = 50.0

Json = dict[str, Any]
#: RFC 6902 operations, e.g. ``[{"op": "test", "path": "/metadata/uid", "value": uid}]``
JsonPatch = list[Json]


#: Asks the API server for a ``PartialObjectMetadata`` instead of the whole object.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


@dataclass(frozen=True)
class ResourceKind:
    """One API resource, and the short token that names it in subjects."""

    token: str
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    #: status is written through the ``status`` subresource (False: on the object itself, for
    #: the few kinds upstream serves without one, such as MetalStackFirewall)
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


#: A certificate or key as a kubeconfig names it: a file path, or the PEM bytes themselves.
Pem = str | bytes


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how we prove who we are.

    Inline certificates and keys stay in memory: ``ssl_context`` loads a CA from memory and
    writes a client certificate and key to a scratch directory only while loading them, so a
    service building one client per tenant cluster (and a new one whenever a kubeconfig
    rotates) leaves nothing behind on disk.
    """

    server: str
    token: str | None = None
    #: read again as it rotates; takes precedence over ``token`` (as in client-go)
    token_file: str | None = None
    ca: Pem | None = None
    client_cert: Pem | None = None
    client_key: Pem | None = None
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
            token_file=str(SERVICE_ACCOUNT_DIR / "token"),
            ca=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        )

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeConfig:
        return cls.parse(path.read_text(), relative_to=path.parent)

    @classmethod
    def parse(cls, text: str, *, relative_to: Path | None = None) -> KubeConfig:
        """The current context of the kubeconfig ``text``; file references are relative to
        ``relative_to`` (the kubeconfig's folder, as kubectl reads them), else used as they are.
        Inline ``*-data`` takes precedence over a file, as in client-go
        (k8s.io/client-go/rest/config.go, ``TLSClientConfig``)."""
        doc = yaml.safe_load(text)
        context_name = doc.get("current-context") or doc["contexts"][0]["name"]
        context = _named(doc["contexts"], context_name)["context"]
        cluster = _named(doc["clusters"], context["cluster"])["cluster"]
        user = _named(doc.get("users") or [], context.get("user", ""), default={"user": {}})["user"]
        token_file = user.get("tokenFile")
        return cls(
            server=str(cluster["server"]).rstrip("/"),
            token=user.get("token"),
            token_file=_relative(relative_to, token_file) if token_file else None,
            ca=_pem(cluster, "certificate-authority", relative_to),
            client_cert=_pem(user, "client-certificate", relative_to),
            client_key=_pem(user, "client-key", relative_to),
            insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if self.insecure:
            return False
        if isinstance(self.ca, bytes):
            context = ssl.create_default_context(cadata=self.ca.decode())
        else:
            context = ssl.create_default_context(cafile=self.ca)
        if self.client_cert:
            _load_cert_chain(context, self.client_cert, self.client_key)
        return context


def _named(items: list[Json], name: str, default: Json | None = None) -> Json:
    for item in items:
        if item.get("name") == name:
            return item
    if default is not None:
        return default
    raise ValueError(f"kubeconfig has no entry named {name!r}")


def _pem(section: Mapping[str, Any], key: str, relative_to: Path | None) -> Pem | None:
    """``key-data`` (inline base64) as bytes, else ``key`` as a path."""
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = section.get(key)
    return _relative(relative_to, path) if path else None


def _relative(folder: Path | None, path: str) -> str:
    return str(folder / path) if folder else str(path)


def _load_cert_chain(context: ssl.SSLContext, cert: Pem, key: Pem | None) -> None:
    """``ssl`` reads certificate chains from files only: PEM bytes touch disk while it does."""
    with tempfile.TemporaryDirectory(prefix="capibus-kubeconfig-") as scratch:
        folder = Path(scratch)
        context.load_cert_chain(
            _on_disk(cert, folder / "client.crt"),
            _on_disk(key, folder / "client.key") if key else None,
        )


def _on_disk(pem: Pem, path: Path) -> str:
    if isinstance(pem, str):
        return pem
    path.write_bytes(pem)
    return str(path)


class TokenFileAuth(httpx.Auth):
    """A bearer token from a file, read again once the last read is ``max_age`` seconds old.

    As client-go (k8s.io/client-go/transport/token_source.go): a read that fails keeps the
    token read last, and a 401 makes the next request read the file again. The read is a
    blocking read of a few hundred bytes, at most once per ``max_age``.
    """

    def __init__(
        self,
        path: str,
        *,
        max_age: float = TOKEN_MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.max_age = max_age
        self.clock = clock
        self._token: str | None = None
        self._read_at = -math.inf

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        response = yield request
        if response.status_code == 401:
            self._read_at = -math.inf

    def token(self) -> str:
        now = self.clock()
        if now - self._read_at >= self.max_age:
            self._read(now)
        if self._token is None:
            raise KubeForbidden(f"no bearer token in {self.path}", reason="Unauthorized")
        return self._token

    def _read(self, now: float) -> None:
        try:
            token = self.path.read_text().strip()
        except OSError:
            return  # keep the last token; with none, token() says so
        if token:
            self._token, self._read_at = token, now


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Json

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


#: (group, version or None for the preferred one, kind)
_KindKey = tuple[str, str | None, str]


def _budget(qps: float | None, burst: int) -> TokenBucket | None:
    """client-go's QPS/burst as a token bucket; no ``qps``, no limit."""
    return TokenBucket(rate=qps, burst=burst) if qps else None


@dataclass
class KubeClient:
    """Async client for the verbs capibus uses; build with ``KubeClient.from_config``."""

    http: httpx.AsyncClient
    limiter: TokenBucket | None = None
    watch_idle_timeout: float = 70.0
    user_agent: str = "capibus"
    max_in_flight: int = 16
    #: how long ``resolve`` remembers that a kind is not served
    discovery_miss_seconds: float = 300.0
    clock: Callable[[], float] = time.monotonic
    _closed: bool = field(default=False, init=False)
    #: a client made by ``with_budget``: its connections belong to the client it came from
    _borrowed: bool = field(default=False, init=False)
    _slots: asyncio.Semaphore = field(init=False)
    _served: dict[_KindKey, ResourceKind] = field(default_factory=dict, init=False)
    #: kinds not served, with when to ask again and why
    _unserved: dict[_KindKey, tuple[float, str]] = field(default_factory=dict, init=False)

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
        auth = TokenFileAuth(config.token_file) if config.token_file else None
        if config.token and auth is None:
            headers["Authorization"] = f"Bearer {config.token}"
        transport = http_transport(
            url_template=path_template,
            verify=config.ssl_context(),
            # Requests hold at most max_in_flight connections; every watch holds one more.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=max_in_flight),
        )
        http = httpx.AsyncClient(
            base_url=config.server,
            headers=headers,
            auth=auth,
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )
        return cls(
            http=http,
            limiter=_budget(qps, burst),
            watch_idle_timeout=watch_idle_timeout,
            max_in_flight=max_in_flight,
        )

    def with_budget(self, *, qps: float | None, burst: int) -> KubeClient:
        """A client on this one's connections, in-flight slots and discovery, with a request
        budget (token bucket) of its own.

        The all-in-one process gives one to each of its services, so that each may ask what
        it could as a process of its own: twelve services sharing one bucket of 50 requests a
        second waited for each other in a burst (``bench/ANALYSIS.md``, "e4 all in one").
        Closing it leaves the connections open: the client it came from owns them.
        """
        view = dataclasses.replace(self, limiter=_budget(qps, burst))
        view._slots, view._served, view._unserved = self._slots, self._served, self._unserved
        view._borrowed = True
        return view

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if not self._borrowed:
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
        response = await self._send(method, path, params=params, body=body, headers=headers)
        _raise_for_status(response, f"{method} {path}")
        result: Json = response.json()
        return result

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The answer, whatever its status; only a failure to get one raises.

        A read whose connection breaks before the answer (reset, or closed without a word) is
        sent once more: a kept-alive connection the server closes just as a request leaves on
        it is an ordinary HTTP/1.1 race, not an outage, and a read is safe to repeat. Go's
        client does the same for replayable requests (``shouldRetryRequest``, net/http/
        transport.go). A write is never repeated here: the server may have applied it.
        """
        async with self._slots:
            if self.limiter:
                await self.limiter.acquire()
            send = functools.partial(
                self.http.request,
                method,
                path,
                params=_params(params),
                content=body,
                headers=headers,
            )
            try:
                if method in _REPEATABLE:
                    with contextlib.suppress(*_BROKEN_CONNECTION):
                        return await send()
                return await send()
            except httpx.HTTPError as exc:
                raise KubeUnavailable(f"{method} {path}: {exc!r}") from exc

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
        limit: int | None = None,
        page_size: int = 500,
    ) -> tuple[list[Json], str]:
        """The items (paged) and the list's resourceVersion, the point to watch from.

        ``limit`` stops after that many items ("is there any?" costs one small page); the
        resourceVersion is then that of the last page read.
        """
        items: list[Json] = []
        params: dict[str, str | int | bool] = {"limit": _page(page_size, limit, items)}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", kind.path(namespace), params=params)
            items.extend(page.get("items", []))
            token = page.get("metadata", {}).get("continue")
            if not token or _page(page_size, limit, items) == 0:
                return items, str(page["metadata"]["resourceVersion"])
            params["continue"] = token
            params["limit"] = _page(page_size, limit, items)

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
        path = _object_path(kind, namespace, name, subresource)
        body = json.dumps(patch).encode()
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def patch_json(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        ops: JsonPatch,
        *,
        subresource: str | None = None,
    ) -> Json:
        """An RFC 6902 JSON Patch. A ``test`` op that fails raises ``KubeConflict`` (the
        object changed meanwhile: read it again and recompute), any other patch the server
        cannot apply ``KubeInvalid``; the module docstring says how the two are told apart."""
        path = _object_path(kind, namespace, name, subresource)
        body = json.dumps(ops).encode()
        response = await self._send("PATCH", path, body=body, headers=_JSON_PATCH_HEADERS)
        if response.status_code == 422 and await self._tests_fail(kind, namespace, name, ops):
            raise KubeConflict(f"PATCH {path}: a test failed, the object changed", delay=0.1)
        _raise_for_status(response, f"PATCH {path}")
        result: Json = response.json()
        return result

    async def _tests_fail(
        self, kind: ResourceKind, namespace: str | None, name: str, ops: JsonPatch
    ) -> bool:
        tests = [op for op in ops if op.get("op") == "test"]
        if not tests:
            return False
        current = await self.get(kind, namespace, name)
        return not all(_holds(current, op["path"], op.get("value")) for op in tests)

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
        path = _object_path(kind, meta.get("namespace"), meta["name"], subresource)
        params: dict[str, str | int | bool] = {"fieldManager": field_manager, "force": force}
        body = json.dumps(obj).encode()
        return await self.request("PATCH", path, params=params, body=body, content_type=APPLY_PATCH)

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        namespace = obj["metadata"].get("namespace")
        return await self.request("POST", kind.path(namespace), body=json.dumps(obj).encode())

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        return await self.request("DELETE", kind.path(namespace, name))

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        """``kind`` of ``group`` (``""``: the core group) as the API server serves it: at
        ``version``, else the group's preferred version, with its plural and scope.

        Raises ``KubeNotFound`` when the group, the version or the kind is not served; both
        answers are remembered (see the module docstring).
        """
        key = (group, version, kind)
        served = self._served.get(key)
        if served is not None:
            return served
        self._raise_if_known_unserved(key)
        try:
            served = await self._discover(group, kind, version)
        except KubeNotFound as exc:
            self._unserved[key] = (self.clock() + self.discovery_miss_seconds, str(exc))
            raise
        self._served[key] = served
        return served

    def _raise_if_known_unserved(self, key: _KindKey) -> None:
        until, reason = self._unserved.get(key, (-math.inf, ""))
        if self.clock() < until:
            raise KubeNotFound(reason)
        self._unserved.pop(key, None)

    async def _discover(self, group: str, kind: str, version: str | None) -> ResourceKind:
        root = f"/apis/{group}" if group else "/api"
        if version is None:
            version = _preferred_version(await self.request("GET", root))
        listing = await self.request("GET", f"{root}/{version}")
        for resource in listing.get("resources", []):
            # "machines/status" and the like are subresources, served under the same kind.
            if resource.get("kind") == kind and "/" not in resource["name"]:
                plural, namespaced = resource["name"], bool(resource.get("namespaced", True))
                return ResourceKind(kind.lower(), group, version, kind, plural, namespaced)
        raise KubeNotFound(f"{kind} is not served by {group or 'the core group'} {version}")


def _object_path(
    kind: ResourceKind, namespace: str | None, name: str, subresource: str | None
) -> str:
    return kind.path(namespace, name) + (f"/{subresource}" if subresource else "")


def path_template(path: str) -> str:
    """``path`` with its namespace and object name as placeholders, the name of a request's
    span (``shared.tracing``): ``/apis/azimuth.stackhpc.com/v1alpha1/namespaces/{namespace}/
    clusters/{name}/status``, one name per kind and verb however many objects there are. A
    path that is not a resource path (discovery, ``/version``) is its own template."""
    parts = path.split("/")
    api = next((i for i, part in enumerate(parts) if part in ("api", "apis")), None)
    if api is None:
        return path
    start = api + (2 if parts[api] == "api" else 3)
    rest = parts[start:]
    name_at = 1  # <plural>/<name>[/<subresource>]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest[1] = "{namespace}"
        name_at = 3  # namespaces/<namespace>/<plural>/<name>[/<subresource>]
    if len(rest) > name_at:
        rest[name_at] = "{name}"
    return "/".join(parts[:start] + rest)


def _page(page_size: int, limit: int | None, items: list[Json]) -> int:
    """How many items to ask for next: a page, or what is left of ``limit``."""
    return page_size if limit is None else min(page_size, limit - len(items))


def _preferred_version(group: Json) -> str:
    """An ``APIGroup``'s preferred version; the core group's ``APIVersions`` names only v1."""
    if "preferredVersion" in group:
        return str(group["preferredVersion"]["version"])
    return str(group["versions"][0])


def _holds(obj: Any, pointer: str, value: Any) -> bool:
    """Whether the RFC 6901 ``pointer`` in ``obj`` names ``value`` (a JSON Patch ``test``)."""
    for escaped in pointer.split("/")[1:]:
        token = escaped.replace("~1", "/").replace("~0", "~")
        try:
            obj = obj[int(token)] if isinstance(obj, list) else obj[token]
        except (LookupError, TypeError, ValueError):
            return False  # a path that does not exist fails a test
    return bool(obj == value)


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

    ``options`` go to ``KubeClient.from_config``. A kubeconfig that cannot be read is a
    ``PermanentError``: the same text never will be.
    """
    try:
        return KubeClient.from_config(KubeConfig.parse(text), **options)
    except (yaml.YAMLError, LookupError, AttributeError, TypeError, ValueError, OSError) as exc:
        # OSError covers ssl.SSLError: certificate data that does not load.
        raise PermanentError(f"unusable kubeconfig: {exc!r}", reason="Kubeconfig") from exc
