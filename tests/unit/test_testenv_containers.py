"""The containers path of the test stack: how it is chosen, which images, and its refusal
where no Docker engine runs (as on the machines CI runs on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testenv import containers


def test_the_local_programs_are_the_default_and_anything_else_is_refused() -> None:
    assert not containers.wanted({})
    assert not containers.wanted({"CAPIBUS_TESTENV": "local"})
    assert containers.wanted({"CAPIBUS_TESTENV": " Containers "})
    with pytest.raises(ValueError, match="expected 'local' or 'containers'"):
        containers.wanted({"CAPIBUS_TESTENV": "docker"})


def test_images_follow_the_pins_of_the_local_programs(tmp_path: Path) -> None:
    pins = tmp_path / "versions.env"
    pins.write_text("# comment\nK8S_VERSION=v1.34.10\nNATS_VERSION=v2.12.15\n")
    assert containers.images(pins) == {
        "k3s": "rancher/k3s:v1.34.10-k3s1",
        "nats": "nats:2.12.15-alpine",
        "redis": containers.REDIS_IMAGE,
    }
    assert set(containers.images()) == {"k3s", "nats", "redis"}  # the real pins parse


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("unix:///nonexistent/docker.sock", "no Docker engine reachable at unix:///nonexistent"),
        ("tcp://127.0.0.1:1", "no Docker engine reachable at tcp://127.0.0.1:1"),
        ("ssh://somewhere", "neither unix:// nor tcp://"),
    ],
)
def test_without_a_docker_engine_it_says_why_in_one_line(host: str, says: str) -> None:
    reason = containers.unavailable({"DOCKER_HOST": host})
    assert reason is not None
    assert "\n" not in reason
    assert says in reason


def test_the_environment_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_URL", "nats://before")
    monkeypatch.delenv("REDIS_URL", raising=False)
    with containers.environment({"NATS_URL": "nats://c", "REDIS_URL": "redis://c"}):
        assert containers.os.environ["NATS_URL"] == "nats://c"
    assert containers.os.environ["NATS_URL"] == "nats://before"
    assert "REDIS_URL" not in containers.os.environ
