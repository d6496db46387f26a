"""The session's secret scan (``leakscan.py``) is not blind: a credential planted on the
session's NATS is found in its stream, at its sequence, and one written by a service process
into its log is found at its line.

Each plant carries a fresh marker registered with ``expect_planted``: the session scan at the
end must then find each marker at exactly one place and accepts what it finds there, so the
plants prove the end-of-session scan too without failing it. The subject is a journal
subject of a namespace no test uses; no service consumes the journal.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from shared import subjects
from shared.bus import Bus
from shared.messages import MetadataChanged, ObjectRef
from testenv.harness import LocalStack
from tests.integration.leakscan import PLANTED, expect_planted, scan_logs, scan_streams
from tests.integration.support import ServiceProcess


async def test_a_credential_planted_on_the_bus_is_found_in_its_stream(
    bus: Bus, stack: LocalStack
) -> None:
    marker = f"planted{secrets.token_hex(16)}"
    expect_planted(marker)
    ref = ObjectRef(api_version="v1", kind="ConfigMap", namespace="secretscan", name="planted")
    subject = subjects.journal("planted", "configmap", "secretscan", "planted")
    leak = MetadataChanged(
        source="secretscan",
        correlation_id="secretscan:planted",
        ref=ref,
        command={"key": f"-----BEGIN PRIVATE KEY-----\n{marker}\n-----END PRIVATE KEY-----"},
    )
    published = await bus.publish(subject, leak)

    findings, read = await scan_streams(stack.endpoints.nats_url)

    where = f"stream CAPIBUS_JOURNAL #{published.sequence} {subject}"
    here = [finding for finding in findings if finding.where == where]
    assert read >= 1
    assert "a PEM private key" in {finding.what for finding in here}
    assert any(finding.what.startswith(PLANTED) for finding in here)
    assert all(marker not in str(finding) for finding in findings)


def test_a_credential_in_a_service_log_is_found_at_its_line(
    stack: LocalStack, tmp_path: Path
) -> None:
    marker = f"planted{secrets.token_hex(16)}"
    expect_planted(marker)
    # ``python -m`` of a module that does not exist names it on stderr, which a service
    # process writes to its log: one line, carrying the marker.
    process = ServiceProcess("planted", stack.env(), tmp_path, "r", module=f"planted_{marker}")
    started = process.start().proc
    assert started is not None
    assert started.wait(30) != 0

    found = [f for f in scan_logs() if f.where.startswith(f"{process.log_path}:")]

    assert [finding.where for finding in found] == [f"{process.log_path}:1"]
    assert found[0].what.startswith(PLANTED)
