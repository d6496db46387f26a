"""The Kubernetes adapter's contract, against httpx.MockTransport (no network).

These pin the library traps the adapter exists to avoid: patches always name their content
type (a dict body must never go out as JSON Patch), a 410 is one typed exception whether it
comes as an HTTP status or as a watch ERROR event, and every HTTP failure becomes a capibus
error type.
"""

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from httpcore._synchronization import current_async_library

from shared.errors import (
    CapibusError,
    KubeConflict,
    KubeExpired,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeTooLarge,
    KubeUnavailable,
    PermanentError,
    TemporaryError,
)
from shared.kube import KubeClient, KubeConfig, TokenFileAuth, WatchExpired
from shared.ratelimit import TokenBucket
from shared.resources import CLUSTER, SECRET

Handler = Callable[[httpx.Request], httpx.Response]
Json = dict[str, Any]


def client(handler: Handler) -> KubeClient:
    http = httpx.AsyncClient(base_url="https://api.test", transport=httpx.MockTransport(handler))
    return KubeClient(http=http)


async def test_status_patch_is_a_json_merge_patch_on_the_subresource() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"metadata": {}})

    kube = client(handler)
    await kube.patch_merge(CLUSTER, "t", "c", {"status": {"phase": "Ready"}}, subresource="status")
    await kube.apply(
        SECRET, {"metadata": {"name": "s", "namespace": "t"}}, field_manager="capibus-helm"
    )
    await kube.aclose()
    patch, apply = seen
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.url.path == "/apis/azimuth.stackhpc.com/v1alpha1/namespaces/t/clusters/c/status"
    assert json.loads(patch.content) == {"status": {"phase": "Ready"}}
    assert apply.headers["content-type"] == "application/apply-patch+yaml"
    assert apply.url.params["fieldManager"] == "capibus-helm"
    assert apply.url.params["force"] == "true"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, KubeNotFound),
        (409, KubeConflict),
        (400, KubeInvalid),
        (422, KubeInvalid),
        (401, KubeForbidden),
        (403, KubeForbidden),
        (408, KubeUnavailable),
        (410, KubeExpired),
        (413, KubeTooLarge),
        (429, KubeUnavailable),
        (500, KubeUnavailable),
        (503, KubeUnavailable),
        (504, KubeUnavailable),
        (405, PermanentError),
    ],
)
async def test_http_failures_become_typed_errors(status: int, error: type[Exception]) -> None:
    kube = client(lambda _: httpx.Response(status, json={"message": "the server's words"}))
    with pytest.raises(error, match="the server's words"):
        await kube.get(CLUSTER, "t", "c")
    await kube.aclose()


async def test_connection_errors_are_temporary() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    kube = client(handler)
    with pytest.raises(KubeUnavailable):
        await kube.get(CLUSTER, "t", "c")
    await kube.aclose()


@pytest.mark.parametrize(
    "broken",
    [httpx.ReadError("reset by peer"), httpx.RemoteProtocolError("disconnected")],
    ids=["reset", "closed"],
)
async def test_a_read_whose_connection_broke_is_sent_once_more(broken: httpx.HTTPError) -> None:
    """A kept-alive connection the server closes as the request leaves is a race, not an
    outage: the read goes again on a fresh connection, once."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            raise broken
        return httpx.Response(200, json={"metadata": {"name": "c"}})

    kube = client(handler)
    assert (await kube.get(CLUSTER, "t", "c"))["metadata"]["name"] == "c"
    await kube.aclose()
    assert calls == ["GET", "GET"]


@pytest.mark.parametrize(
    ("call", "sent"),
    [
        (lambda kube: kube.get(CLUSTER, "t", "c"), ["GET", "GET"]),
        (lambda kube: kube.patch_merge(CLUSTER, "t", "c", {"spec": {}}), ["PATCH"]),
    ],
    ids=["a read goes twice", "a write once: the server may have applied it"],
)
async def test_a_connection_that_keeps_breaking_is_temporary(
    call: Callable[[KubeClient], Any], sent: list[str]
) -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        raise httpx.ReadError("reset by peer", request=request)

    kube = client(handler)
    with pytest.raises(KubeUnavailable):
        await call(kube)
    await kube.aclose()
    assert calls == sent


async def test_list_follows_continue_tokens_and_returns_the_list_version() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if "continue" not in request.url.params:
            return httpx.Response(
                200,
                json={"items": [{"a": 1}], "metadata": {"continue": "k", "resourceVersion": "9"}},
            )
        return httpx.Response(
            200, json={"items": [{"b": 2}], "metadata": {"resourceVersion": "10"}}
        )

    kube = client(handler)
    items, version = await kube.list(CLUSTER)
    await kube.aclose()
    assert items == [{"a": 1}, {"b": 2}]
    assert version == "10"


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(410, json={"message": "too old"}),
        httpx.Response(
            200,
            content=json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
            + "\n",
        ),
    ],
)
async def test_gone_is_watch_expired_however_it_arrives(response: httpx.Response) -> None:
    kube = client(lambda _: response)
    with pytest.raises(WatchExpired):
        async for _ in kube.watch(CLUSTER, resource_version="1"):
            pass
    await kube.aclose()


async def test_watch_asks_for_bookmarks_and_yields_events() -> None:
    lines = [
        {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
    ]
    params: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        params.update(request.url.params)
        return httpx.Response(200, content="\n".join(json.dumps(line) for line in lines) + "\n")

    kube = client(handler)
    events = [e async for e in kube.watch(CLUSTER, resource_version="4")]
    await kube.aclose()
    assert [(e.type, e.resource_version) for e in events] == [("ADDED", "5"), ("BOOKMARK", "7")]
    assert params["allowWatchBookmarks"] == "true"
    assert params["resourceVersion"] == "4"


class _SilentAfterOneEvent(httpx.AsyncByteStream):
    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield b'{"type": "ADDED", "object": {"metadata": {"resourceVersion": "5"}}}\n'
        raise httpx.ReadTimeout("no event and no bookmark for 70s")


async def test_a_silent_watch_ends_as_temporary_so_the_caller_re_watches() -> None:
    kube = client(lambda _: httpx.Response(200, stream=_SilentAfterOneEvent()))
    seen: list[str] = []

    async def follow() -> None:
        async for event in kube.watch(CLUSTER, resource_version="4"):
            seen.append(event.resource_version)

    with pytest.raises(KubeUnavailable, match="no event and no bookmark"):
        await follow()
    await kube.aclose()
    assert seen == ["5"]


async def test_httpcore_asks_for_sniffio_without_searching_the_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpcore imports sniffio for every lock, event and cancel shield of a request and falls
    back to asyncio without it. Absent (anyio 4.11+ no longer pulls it in), each of those
    imports searched ``sys.path`` again: a fifth of a request's CPU (encode/httpcore discussion
    #1102). capibus therefore depends on sniffio itself, so the import is a dictionary hit."""
    assert current_async_library() == "asyncio"  # an installed sniffio is imported here, once
    searched: list[str] = []

    class Spy:
        def find_spec(self, name: str, *_: object) -> None:
            searched.append(name)

    monkeypatch.setattr(sys, "meta_path", [Spy(), *sys.meta_path])
    assert current_async_library() == "asyncio"
    assert "sniffio" not in searched


@pytest.mark.parametrize(
    ("error", "temporary"),
    [
        (KubeUnavailable, True),
        (KubeExpired, True),
        (KubeConflict, True),
        (KubeInvalid, False),
        (KubeForbidden, False),
        (KubeTooLarge, False),
    ],
)
def test_what_heals_by_waiting_is_temporary(error: type[Exception], temporary: bool) -> None:
    assert issubclass(error, TemporaryError) is temporary
    assert issubclass(error, PermanentError) is not temporary


async def test_retry_after_becomes_the_suggested_delay() -> None:
    kube = client(lambda _: httpx.Response(429, headers={"Retry-After": "3"}, json={}))
    with pytest.raises(KubeUnavailable) as caught:
        await kube.get(CLUSTER, "t", "c")
    await kube.aclose()
    assert caught.value.delay == 3.0


def test_a_watch_that_expired_asks_for_a_re_list_not_a_retry() -> None:
    assert issubclass(WatchExpired, CapibusError)
    assert not issubclass(WatchExpired, TemporaryError | PermanentError)


# --- JSON Patch ---------------------------------------------------------------------------

#: kube-apiserver 1.34's whole answer to a JSON Patch it cannot apply, a failed test included
CANNOT_APPLY = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server rejected our request due to an error in our request",
    "reason": "Invalid",
    "details": {},
    "code": 422,
}
GUARD = [
    {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
    {"op": "add", "path": "/metadata/finalizers/-", "value": "capibus"},
]


def patch_server(current: Json, seen: list[httpx.Request]) -> Handler:
    """Refuses every patch as kube-apiserver refuses one it cannot apply; GET reads ``current``."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "PATCH":
            return httpx.Response(422, json=CANNOT_APPLY)
        return httpx.Response(200, json=current)

    return handler


async def test_json_patch_names_its_content_type_and_the_subresource() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"metadata": {"resourceVersion": "8"}})

    kube = client(handler)
    result = await kube.patch_json(CLUSTER, "t", "c", GUARD, subresource="status")
    await kube.aclose()
    [patch] = seen
    assert result == {"metadata": {"resourceVersion": "8"}}
    assert patch.headers["content-type"] == "application/json-patch+json"
    assert patch.url.path == "/apis/azimuth.stackhpc.com/v1alpha1/namespaces/t/clusters/c/status"
    assert json.loads(patch.content) == GUARD


async def test_a_failed_test_op_is_a_conflict() -> None:
    seen: list[httpx.Request] = []
    kube = client(patch_server({"metadata": {"resourceVersion": "9"}}, seen))
    with pytest.raises(KubeConflict, match="a test failed"):
        await kube.patch_json(CLUSTER, "t", "c", GUARD)
    await kube.aclose()
    assert [(r.method, r.url.path) for r in seen][1] == (
        "GET",
        "/apis/azimuth.stackhpc.com/v1alpha1/namespaces/t/clusters/c",
    )


async def test_a_patch_that_cannot_apply_although_its_tests_hold_is_invalid() -> None:
    seen: list[httpx.Request] = []
    kube = client(patch_server({"metadata": {"resourceVersion": "7"}}, seen))
    remove_missing = [GUARD[0], {"op": "remove", "path": "/spec/nothing"}]
    with pytest.raises(KubeInvalid, match="the server rejected our request"):
        await kube.patch_json(CLUSTER, "t", "c", remove_missing)
    await kube.aclose()


async def test_a_patch_without_tests_is_invalid_without_reading_the_object() -> None:
    seen: list[httpx.Request] = []
    kube = client(patch_server({}, seen))
    with pytest.raises(KubeInvalid):
        await kube.patch_json(CLUSTER, "t", "c", [{"op": "remove", "path": "/spec/nothing"}])
    await kube.aclose()
    assert [r.method for r in seen] == ["PATCH"]


@pytest.mark.parametrize(
    ("path", "value", "conflict"),
    [
        ("/metadata/annotations/a~1b", "x", False),  # RFC 6901: ~1 is "/"
        ("/metadata/annotations/c~0d", "y", False),  # and ~0 is "~"
        ("/metadata/finalizers/1", "second", False),
        ("/metadata/finalizers/2", "third", True),  # no such index
        ("/metadata/labels/app", "x", True),  # no such member
        ("/metadata/annotations/a~1b", "other", True),
        ("/metadata/finalizers/x", "first", True),  # not an index
    ],
)
async def test_test_ops_are_checked_as_rfc_6901_pointers(
    path: str, value: str, conflict: bool
) -> None:
    current = {
        "metadata": {
            "annotations": {"a/b": "x", "c~d": "y"},
            "finalizers": ["first", "second"],
        }
    }
    kube = client(patch_server(current, []))
    with pytest.raises(KubeConflict if conflict else KubeInvalid):
        await kube.patch_json(CLUSTER, "t", "c", [{"op": "test", "path": path, "value": value}])
    await kube.aclose()


async def test_a_patched_object_gone_meanwhile_is_not_found() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            return httpx.Response(422, json=CANNOT_APPLY)
        return httpx.Response(404, json={"message": 'clusters "c" not found'})

    kube = client(handler)
    with pytest.raises(KubeNotFound):
        await kube.patch_json(CLUSTER, "t", "c", GUARD)
    await kube.aclose()


# --- list limit ---------------------------------------------------------------------------


async def test_a_limited_list_reads_no_more_than_it_needs() -> None:
    limits: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        limits.append(request.url.params["limit"])
        more = {"continue": "k"} if len(limits) < 5 else {}
        items = [{"n": i} for i in range(int(request.url.params["limit"]))]
        return httpx.Response(
            200, json={"items": items, "metadata": {"resourceVersion": "3", **more}}
        )

    kube = client(handler)
    one, version = await kube.list(CLUSTER, label_selector="a=b", limit=1)
    five, _ = await kube.list(CLUSTER, limit=5, page_size=2)
    await kube.aclose()
    assert (len(one), version) == (1, "3")
    assert len(five) == 5
    assert limits == ["1", "2", "2", "1"]


# --- discovery ----------------------------------------------------------------------------

INFRA = "infrastructure.cluster.x-k8s.io"
MACHINES = {
    "resources": [
        {"name": "openstackmachines/status", "kind": "OpenStackMachine", "namespaced": True},
        {"name": "openstackmachines", "kind": "OpenStackMachine", "namespaced": True},
    ]
}
#: discovery documents as kube-apiserver serves them (trimmed)
APIS: dict[str, Json] = {
    f"/apis/{INFRA}": {
        "kind": "APIGroup",
        "preferredVersion": {"groupVersion": f"{INFRA}/v1beta2", "version": "v1beta2"},
    },
    f"/apis/{INFRA}/v1beta1": MACHINES,
    f"/apis/{INFRA}/v1beta2": MACHINES,
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": {
        "resources": [
            {"name": "namespaces", "kind": "Namespace", "namespaced": False},
            {"name": "secrets", "kind": "Secret", "namespaced": True},
        ]
    },
}


class Discovery:
    """An API server's discovery documents, a clock, and the paths asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.now = 0.0
        self.failing = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url.path)
        if self.failing:
            return httpx.Response(503, json={"message": "etcd leader changed"})
        document = APIS.get(request.url.path)
        if document is None:  # the API server's plain-text 404 for a group it does not serve
            return httpx.Response(404, text="404 page not found")
        return httpx.Response(200, json=document)

    def client(self) -> KubeClient:
        http = httpx.AsyncClient(
            base_url="https://api.test", transport=httpx.MockTransport(self.handler)
        )
        return KubeClient(http=http, discovery_miss_seconds=60, clock=lambda: self.now)


async def test_resolve_finds_the_preferred_version_plural_and_scope_once() -> None:
    api = Discovery()
    kube = api.client()
    first = await kube.resolve(INFRA, "OpenStackMachine")
    again = await kube.resolve(INFRA, "OpenStackMachine")
    pinned = await kube.resolve(INFRA, "OpenStackMachine", version="v1beta1")
    await kube.aclose()
    assert first is again
    assert (first.api_version, first.plural, first.namespaced) == (
        f"{INFRA}/v1beta2",
        "openstackmachines",
        True,
    )
    assert first.path("ns", "m") == f"/apis/{INFRA}/v1beta2/namespaces/ns/openstackmachines/m"
    assert pinned.version == "v1beta1"
    assert api.asked == [f"/apis/{INFRA}", f"/apis/{INFRA}/v1beta2", f"/apis/{INFRA}/v1beta1"]


async def test_resolve_knows_the_core_group_and_cluster_scoped_kinds() -> None:
    kube = Discovery().client()
    secret = await kube.resolve("", "Secret")
    namespace = await kube.resolve("", "Namespace")
    await kube.aclose()
    assert secret.path("ns", "s") == "/api/v1/namespaces/ns/secrets/s"
    assert namespace.path("ignored", "n") == "/api/v1/namespaces/n"


@pytest.mark.parametrize(
    ("group", "kind", "version"),
    [
        ("metal.example", "MetalMachine", None),  # group not served
        (INFRA, "MetalMachine", None),  # kind not served
        (INFRA, "OpenStackMachine", "v1alpha9"),  # version not served
    ],
)
async def test_an_unserved_kind_is_not_found_and_not_asked_for_again_for_a_while(
    group: str, kind: str, version: str | None
) -> None:
    api = Discovery()
    kube = api.client()
    with pytest.raises(KubeNotFound):
        await kube.resolve(group, kind, version=version)
    asked = len(api.asked)
    api.now = 59
    with pytest.raises(KubeNotFound):
        await kube.resolve(group, kind, version=version)
    assert len(api.asked) == asked
    api.now = 60  # a CRD may have been installed meanwhile
    with pytest.raises(KubeNotFound):
        await kube.resolve(group, kind, version=version)
    await kube.aclose()
    assert len(api.asked) == 2 * asked


async def test_a_discovery_failure_is_not_remembered() -> None:
    api = Discovery()
    kube = api.client()
    api.failing = True
    with pytest.raises(KubeUnavailable):
        await kube.resolve("", "Secret")
    api.failing = False
    secret = await kube.resolve("", "Secret")
    await kube.aclose()
    assert secret.plural == "secrets"


# --- credentials --------------------------------------------------------------------------


async def test_a_token_file_is_read_again_as_it_rotates(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [0.0]
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["Authorization"])
        return httpx.Response(401 if sent[-1] == "Bearer revoked" else 200, json={})

    auth = TokenFileAuth(str(token), clock=lambda: now[0])
    http = httpx.AsyncClient(
        base_url="https://api.test", auth=auth, transport=httpx.MockTransport(handler)
    )
    kube = KubeClient(http=http)

    async def ask() -> None:
        with contextlib.suppress(KubeForbidden):
            await kube.get(CLUSTER, "t", "c")

    await ask()
    token.write_text("second\n")  # the kubelet rotated it
    now[0] = 49.0
    await ask()
    now[0] = 50.0
    await ask()
    token.unlink()  # mid-swap: keep what we have
    now[0] = 200.0
    await ask()
    token.write_text("revoked")
    now[0] = 300.0
    await ask()
    token.write_text("third")
    await ask()  # a 401 made this one read the file again, whatever its age
    await kube.aclose()
    assert sent == [
        "Bearer first",
        "Bearer first",
        "Bearer second",
        "Bearer second",
        "Bearer revoked",
        "Bearer third",
    ]


async def test_no_token_to_read_is_forbidden(tmp_path: Path) -> None:
    auth = TokenFileAuth(str(tmp_path / "absent"))
    http = httpx.AsyncClient(
        base_url="https://api.test",
        auth=auth,
        transport=httpx.MockTransport(lambda _: httpx.Response(200, json={})),
    )
    kube = KubeClient(http=http)
    with pytest.raises(KubeForbidden, match="no bearer token"):
        await kube.get(CLUSTER, "t", "c")
    await kube.aclose()


def test_in_cluster_reads_the_service_account_token_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = KubeConfig.in_cluster()
    assert config.server == "https://10.0.0.1:443"
    assert config.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert config.token is None


def kubeconfig_text(cluster: Json, user: Json) -> str:
    return yaml.safe_dump(
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://api.test:6443/", **cluster}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


def test_a_kubeconfig_file_names_files_relative_to_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    user = {"token": "static", "tokenFile": "token", "client-certificate": "/abs/client.crt"}
    path.write_text(kubeconfig_text({"certificate-authority": "ca.crt"}, user))
    config = KubeConfig.from_kubeconfig(path)
    assert config.server == "https://api.test:6443"
    assert config.ca == str(tmp_path / "ca.crt")
    assert config.token_file == str(tmp_path / "token")
    assert config.client_cert == "/abs/client.crt"


def test_inline_data_takes_precedence_over_a_file() -> None:
    cluster = {"certificate-authority": "ca.crt", "certificate-authority-data": "UEVN"}
    config = KubeConfig.parse(kubeconfig_text(cluster, {"client-key-data": "S0VZ"}))
    assert (config.ca, config.client_key) == (b"PEM", b"KEY")
    assert config.token is None


async def test_a_token_file_takes_precedence_over_a_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("rotating")
    config = KubeConfig(
        server="https://api.test", token="static", token_file=str(tmp_path / "token")
    )
    kube = KubeClient.from_config(config, qps=None)
    await kube.aclose()
    assert "Authorization" not in kube.http.headers
    assert isinstance(kube.http.auth, TokenFileAuth)


async def test_a_client_with_a_budget_of_its_own_shares_the_connections_not_the_budget() -> None:
    answered: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        answered.append(request.url.path)
        return httpx.Response(200, json={"metadata": {"name": "x"}})

    shared = client(handler)
    shared.limiter = TokenBucket(rate=0.001, burst=1)
    own = shared.with_budget(qps=0.001, burst=1)
    assert own.http is shared.http
    assert own._slots is shared._slots
    assert own.limiter is not shared.limiter

    # One token each: the second request of either would wait ~17 minutes; both go at once.
    async with asyncio.timeout(2):
        await shared.get(SECRET, "ns", "a")
        await own.get(SECRET, "ns", "b")
    assert answered == ["/api/v1/namespaces/ns/secrets/a", "/api/v1/namespaces/ns/secrets/b"]

    await own.aclose()
    assert not shared.http.is_closed
    await shared.aclose()
    assert shared.http.is_closed
