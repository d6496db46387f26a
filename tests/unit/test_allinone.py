"""The all-in-one runner: which services it chooses, and that one failure stops them all."""

from __future__ import annotations

import asyncio
import importlib
import inspect

import httpx
import pytest

from services import allinone
from services.allinone import COMPONENTS, ServiceFailed, UnknownService, choose, supervise
from shared.kube import KubeClient
from shared.runtime import Infrastructure
from shared.settings import ServiceSettings

pytestmark = pytest.mark.timeout(10)


def test_all_is_every_default_service_and_names_add_optional_ones() -> None:
    everything = [c.name for c in choose(["all"])]
    assert everything[0] == "watcher"
    assert "admission" not in everything
    assert "exporter" not in everything
    assert [c.name for c in choose(["all", "exporter"])] == [*everything, "exporter"]
    assert [c.name for c in choose(["lease", " writer", ""])] == ["writer", "lease"]


def test_an_unknown_or_empty_choice_is_refused() -> None:
    with pytest.raises(UnknownService, match="helmet"):
        choose(["helmet"])
    with pytest.raises(UnknownService):
        choose([""])


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_every_root_and_settings_class_loads(
    component: allinone.Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPIBUS_ADMISSION__CERT_FILE", "/tls/tls.crt")
    monkeypatch.setenv("CAPIBUS_ADMISSION__KEY_FILE", "/tls/tls.key")
    root, settings = component.load()
    assert "infra" in inspect.signature(root).parameters
    assert type(settings).__name__ == component.settings


async def until_stopped(stop: asyncio.Event, stopped: list[str], name: str) -> None:
    await stop.wait()
    stopped.append(name)


async def test_sigterm_stops_every_service_gracefully() -> None:
    stop, stopped = asyncio.Event(), list[str]()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    work = {name: until_stopped(stop, stopped, name) for name in ("a", "b")}
    await supervise(work, stop, grace=1)
    assert sorted(stopped) == ["a", "b"]


async def test_a_failing_service_stops_the_others_and_is_named() -> None:
    stop, stopped = asyncio.Event(), list[str]()

    async def broken() -> None:
        raise RuntimeError("boom")

    work = {"a": until_stopped(stop, stopped, "a"), "broken": broken()}
    with pytest.raises(ServiceFailed, match="broken"):
        await supervise(work, stop, grace=1)
    assert stopped == ["a"]


async def test_a_service_ending_unasked_is_a_failure() -> None:
    stop, stopped = asyncio.Event(), list[str]()

    async def quitter() -> None:
        return

    work = {"a": until_stopped(stop, stopped, "a"), "quitter": quitter()}
    with pytest.raises(ServiceFailed, match="quitter"):
        await supervise(work, stop, grace=1)
    assert stopped == ["a"]


async def test_a_service_that_will_not_stop_is_cancelled_after_the_grace() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def broken() -> None:
        raise RuntimeError("boom")

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    with pytest.raises(ServiceFailed, match="broken"):
        await supervise({"broken": broken(), "stubborn": stubborn()}, stop, grace=0.05)
    assert cancelled.is_set()


def test_every_root_takes_the_shared_clients() -> None:
    for component in allinone.COMPONENTS:
        root = importlib.import_module(f"{component.package}.bootstrap").run
        assert "infra" in inspect.signature(root).parameters, component.name


async def test_each_service_has_a_kubernetes_budget_of_its_own_on_the_shared_clients() -> None:
    kube = KubeClient(http=httpx.AsyncClient(base_url="https://api.test"))
    infra = Infrastructure(bus=object(), kube=kube, redis_url="redis://127.0.0.1:1/0")  # type: ignore[arg-type]
    writer = infra.for_service(ServiceSettings(kube_qps=50, kube_burst=100))
    helm = infra.for_service(ServiceSettings(kube_qps=20, kube_burst=30))

    assert writer.bus is helm.bus is infra.bus
    assert writer.redis is helm.redis is infra.redis
    assert writer.kube.http is helm.kube.http is kube.http
    assert writer.kube.limiter is not helm.kube.limiter
    assert helm.kube.limiter is not None
    assert (helm.kube.limiter.rate, helm.kube.limiter.capacity) == (20, 30)
    await kube.aclose()
