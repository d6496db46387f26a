"""Settings every service shares; each service subclasses ``ServiceSettings``.

Connection settings read the conventional variables (``KUBECONFIG``, ``NATS_URL``,
``REDIS_URL``) so the test harness, the demo and the Helm chart all configure every service the
same way; everything else reads ``CAPIBUS_<NAME>``, with ``__`` into sections: shared tuning
(``CAPIBUS_CONSUMER__ACK_WAIT=15``) and each service's own section
(``CAPIBUS_WRITER__COALESCE_SECONDS=0.05``), the same vocabulary the Helm chart uses.
Mounted Secrets (e.g. the Redis password) can come from ``secrets_dir``.

Credentials are files, not values (``Credentials``): ``CAPIBUS_CREDENTIALS__DIR`` holds one
directory per user with ``nats-password`` and ``redis-password``, so a Kubernetes Secret mounts
as it is and rotating a password is a file swap plus a restart. The user is the service's
name on the bus unless ``CAPIBUS_CREDENTIALS__USER`` says otherwise; with no directory the
URLs are used as they are (their own ``user:password@``, or none).

TLS to NATS and Redis (``TransportSecurity``) is chosen by the URL (``tls://``, ``rediss://``):
a scheme is visible wherever the URL is (logs, the chart's values), and a service told to use
TLS refuses a server that would talk plaintext (``shared.bus``, ``shared.resp``). The CA files
only say whom to trust: with none, the system's CAs.

The tuning sections build their ``shared.bus``/``shared.consumer`` values lazily: importing
those pulls in nats-py (~8 MiB of RSS), and a service that never touches NATS (admission)
reads its settings from here too.
"""

from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from shared.bus import Retention
    from shared.consumer import ConsumerSettings


def _replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ConsumerTuning(BaseModel):
    ack_wait: float = Field(
        30.0, gt=0, description="Seconds before an unacked message is redelivered"
    )
    max_deliver: int = Field(
        8,
        ge=1,
        description="Deliveries before a message whose handler keeps failing unexpectedly (or "
        "crashing the process) is dead-lettered; temporary errors never use them up",
    )
    max_ack_pending: int = Field(1000, ge=1, description="Unacked messages per partition consumer")
    fetch_batch: int = Field(200, ge=1, description="Messages per pull request")
    fetch_timeout: float = Field(
        120.0,
        gt=0,
        description="How long one pull request waits at the server for a message (a long poll: "
        "an idle service wakes once per this, per partition and subscription)",
    )
    backoff_base: float = Field(0.5, gt=0, description="First retry delay in seconds")
    backoff_max: float = Field(
        60.0, gt=0, description="Longest retry delay in seconds (temporary errors retry forever)"
    )

    def build(self) -> ConsumerSettings:
        from shared.consumer import ConsumerSettings  # noqa: PLC0415 (lazy: module docstring)

        return ConsumerSettings(**self.model_dump())


class RetentionTuning(BaseModel):
    max_age_seconds: float = Field(7 * 24 * 3600, gt=0, description="How long history is kept")
    max_bytes: int = Field(1 << 30, gt=0, description="Size cap per stream")
    duplicate_window_seconds: float = Field(600, ge=300, description="Publish dedupe window")
    replicas: int = Field(
        1,
        ge=1,
        le=5,
        description="Copies of every stream JetStream keeps (on a cluster of at least as many "
        "servers)",
    )

    def build(self) -> Retention:
        from shared.bus import Retention  # noqa: PLC0415 (lazy: module docstring)

        return Retention(**self.model_dump())


class AzimuthFeatures(BaseModel):
    """Deployment-wide switches every lifecycle service must agree on (one Helm value)."""

    oidc_enabled: bool = Field(
        False, description="Give each Cluster an OIDCClient and Platform, and OIDC Helm values"
    )
    zenith_enabled: bool = Field(
        False, description="Reach each Cluster's API server and services through Zenith"
    )


class Credentials(BaseModel):
    """Where this process finds its NATS and Redis passwords (``shared.access``)."""

    dir: Path | None = Field(
        None, description="Directory with <user>/nats-password and <user>/redis-password"
    )
    user: str | None = Field(None, description="The user to log in as (default: the service)")

    def login(self, service: str, system: str) -> tuple[str, str] | None:
        """(user, password) for ``system`` (``nats`` or ``redis``), or None (log in as the
        URL says) without a directory or without one for this user; a missing file in the
        user's directory is a configuration error naming the path."""
        if self.dir is None:
            return None
        user = self.user or service
        if not (self.dir / user).is_dir():
            return None
        path = self.dir / user / f"{system}-password"
        try:
            return user, path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"no {system} password for user {user!r} at {path}: {exc}") from exc


def _env(*names: str) -> Any:
    return AliasChoices(*names)


class TransportSecurity(BaseModel):
    """Whom to trust on ``tls://`` and ``rediss://`` connections, and an optional client
    certificate for servers that verify clients (mutual TLS)."""

    nats_ca_file: Path | None = Field(None, description="PEM CAs trusted for NATS")
    redis_ca_file: Path | None = Field(None, description="PEM CAs trusted for Redis")
    cert_file: Path | None = Field(None, description="PEM client certificate (both servers)")
    key_file: Path | None = Field(None, description="PEM key of cert_file")

    def context(self, url: str) -> ssl.SSLContext | None:
        """The TLS context for ``url`` (NATS ``tls://``, possibly a comma-separated list, or
        Redis ``rediss://``), None for a plaintext URL; unreadable files are a configuration
        error naming the path. Built only when used: loading CAs costs memory."""
        schemes = {server.strip().partition("://")[0] for server in url.split(",")}
        system = "nats" if "tls" in schemes else "redis" if "rediss" in schemes else None
        if system is None:
            return None
        ca_file = self.nats_ca_file if system == "nats" else self.redis_ca_file
        try:
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{system} TLS files: {exc}") from exc
        return context


class _TransportSecurityOnly(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CAPIBUS_", env_nested_delimiter="__", extra="ignore"
    )

    tls: TransportSecurity = TransportSecurity()


def transport_security() -> TransportSecurity:
    """``CAPIBUS_TLS__*`` alone, for a process that reads no other service setting (the
    command line)."""
    return _TransportSecurityOnly().tls


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CAPIBUS_", env_nested_delimiter="__", extra="ignore", secrets_dir=None
    )

    kubeconfig: str | None = Field(None, validation_alias=_env("KUBECONFIG", "CAPIBUS_KUBECONFIG"))
    nats_url: str = Field(
        "nats://127.0.0.1:4222", validation_alias=_env("NATS_URL", "CAPIBUS_NATS_URL")
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias=_env("REDIS_URL", "CAPIBUS_REDIS_URL")
    )
    credentials: Credentials = Credentials()
    tls: TransportSecurity = TransportSecurity()
    replica: str = Field(default_factory=_replica_id, description="This replica's member id")
    partitions: int = Field(16, ge=1, le=1024, description="Must be equal for every service")
    lease_ttl: float = Field(6.0, gt=0.5, description="Partition lease time-to-live, seconds")
    kube_qps: float = Field(50.0, gt=0, description="Average API requests per second")
    kube_burst: int = Field(100, ge=1, description="API requests allowed in a burst")
    kube_max_in_flight: int = Field(16, ge=1, description="Concurrent API requests (not watches)")
    log_level: str = Field("INFO", description="Python logging level")
    log_json: bool = Field(False, description="One JSON object per log line")
    azimuth: AzimuthFeatures = AzimuthFeatures()
    consumer: ConsumerTuning = ConsumerTuning()
    retention: RetentionTuning = RetentionTuning()
