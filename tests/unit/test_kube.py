"""The Kubernetes adapter's contract, against httpx.MockTransport (no network).

These pin the library traps the adapter exists to avoid: patches always name their content
type (a dict body must never go out as JSON Patch), a 410 is one typed exception whether it
comes as an HTTP status or as a watch ERROR event, and every HTTP failure becomes a capibus
error type.
"""

import json
import sys
from collections.abc import Callable

import httpx
import pytest
from httpcore._synchronization import current_async_library

from shared.errors import (
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
from shared.kube import KubeClient, WatchExpired
from shared.resources import CLUSTER, SECRET

Handler = Callable[[httpx.Request], httpx.Response]


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
