"""The writer's own defaults where they differ from every service's."""

import pytest

from services.writer.settings import WriterSettings
from shared.settings import ServiceSettings


def test_the_writer_keeps_fewer_api_requests_in_flight_than_the_shared_default() -> None:
    # httpx's pool costs CPU per request in proportion to its connections, and a burst of
    # status writes holds every slot (bench/ANALYSIS.md, 2026-11-25).
    assert WriterSettings().kube_max_in_flight == 8
    assert ServiceSettings().kube_max_in_flight == 16


def test_the_in_flight_bound_is_still_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPIBUS_KUBE_MAX_IN_FLIGHT", "3")
    assert WriterSettings().kube_max_in_flight == 3
