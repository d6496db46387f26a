"""The error vocabulary every service speaks.

Handlers never see a third-party exception: adapters (``shared.kube``, ``shared.bus``,
``shared.coordination``) catch what httpx, nats-py and redis raise and re-raise one of these,
chaining the original as ``__cause__``. The consumption helper maps the two retry classes onto
JetStream once, so no handler decides how to ack::

    CapibusError
    ├── TemporaryError          try again later, with capped backoff, until it heals
    │   ├── KubeUnavailable     connection refused/reset, timeout, 408, 429, 5xx
    │   ├── KubeExpired         410 outside a watch: a continue token too old; list again
    │   ├── KubeConflict        409, or a JSON Patch whose test failed: re-read, try again
    │   ├── BusUnavailable      NATS down or JetStream timing out
    │   │   └── StreamFull      a stream near its limit whose oldest messages a durable
    │   │                       consumer still needs (``shared.bus``): wait for it
    │   ├── LockUnavailable     Redis down: we cannot prove exclusivity, so we wait
    │   ├── RegistrarUnavailable    shared.zenith: unreachable, timeout, 408, 429, 5xx
    │   ├── RepositoryUnavailable   shared.charts: the same, for a chart repository
    │   └── ChartNotFound, HelmUnavailable, HelmFailed
    │                           shared.helm: a chart that may come back, an unreachable API
    │                           server, timeouts, another operation, CRDs not yet installed
    ├── PermanentError          retrying cannot help: condition on the object + dead letter
    │   ├── KubeInvalid         400/422: the server rejected the content
    │   ├── KubeForbidden       401/403: credentials or RBAC are wrong
    │   ├── KubeTooLarge        413: the request (or its etcd entry) is over the size limit
    │   ├── BadMessage          undecodable or schema-invalid message
    │   ├── MessageTooLarge     a message over the bus's maximum payload
    │   ├── RegistrarConflict   shared.zenith: 409, the subdomain is taken or the key bound
    │   ├── RepositoryInvalid   shared.charts: other 4xx, a malformed index or chart
    │   └── HelmRejected        shared.helm: ChartRenderFailed, InvalidReleaseName,
    │                           ReleaseObjectsInvalid, ReleaseTooLarge, HelmForbidden
    ├── KubeNotFound            404: a fact, not a failure (below)
    └── WatchExpired            410 in a watch: its resourceVersion is compacted; re-list

The line between the two is whether waiting can heal the failure; when a human must act (RBAC,
an invalid object, a name too long) it is permanent, so the reason reaches them at once instead
of after every retry has been spent. The helm adapter's errors are also ``HelmError``, and its
``ReleaseNotFound``, like ``KubeNotFound``, is a fact, not a failure.

``KubeNotFound`` stands apart: a missing object is a fact handlers act on (drop the status
update, treat as deleted), not a failure of the run.

``WatchExpired`` stands apart too: neither waiting nor giving up is the answer, listing again
is. Only a loop that watches meets it (the watcher, discovery's tenant watches, the stand-ins),
and each catches it before its ``TemporaryError`` clause, re-lists and watches from the list's
resourceVersion. Were it ever to reach the consumption helper, it would be an unexpected
exception there (never acked, redelivered), which is right for a handler that watched without
knowing how to re-list.
"""

from __future__ import annotations


class CapibusError(Exception):
    """Base of every error capibus raises on purpose."""


class TemporaryError(CapibusError):
    """The same work should succeed later; ``delay`` is the suggested wait in seconds."""

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(CapibusError):
    """Retrying the same input cannot succeed; the reason must reach a human."""

    def __init__(self, message: str, *, reason: str = "Failed") -> None:
        super().__init__(message)
        self.reason = reason


class KubeUnavailable(TemporaryError):
    """The API server is unreachable, timed out (408), overloaded (429) or failing (5xx)."""


class KubeExpired(TemporaryError):
    """410 Gone outside a watch: a continue token or resourceVersion expired; a new list heals."""


class KubeConflict(TemporaryError):
    """Optimistic concurrency lost (409, or a failed JSON Patch ``test``); re-read, converge."""


class BusUnavailable(TemporaryError):
    """NATS or JetStream did not answer."""


class StreamFull(BusUnavailable):
    """A publish refused: the stream is near its limit and discarding its oldest messages
    would lose work a durable consumer has not handled yet. It heals when the consumer
    catches up; it is a ``BusUnavailable`` so every publisher's retry already covers it."""

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


class LockUnavailable(TemporaryError):
    """Redis did not answer, so exclusivity cannot be proven."""


class KubeInvalid(PermanentError):
    """The API server rejected the content (422)."""


class KubeForbidden(PermanentError):
    """The API server refused our credentials (401/403)."""


class KubeTooLarge(PermanentError):
    """413: the request, or what etcd would store, is larger than the server accepts."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="TooLarge")


class BadMessage(PermanentError):
    """A message that cannot be decoded or does not match its contract."""


class MessageTooLarge(PermanentError):
    """A message larger than the NATS server accepts: sending it again cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="MessageTooLarge")


class KubeNotFound(CapibusError):
    """The object (or its kind) does not exist."""


class WatchExpired(CapibusError):
    """The resourceVersion we watch from was compacted away; the caller must re-list."""


def transient_http_status(code: int) -> bool:
    """Whether an HTTP failure can heal by waiting: request timeout, rate limit, server error."""
    return code in (408, 429) or code >= 500


def retry_after(header: str | None) -> float | None:
    """The delay a ``Retry-After`` header asks for, in seconds (the date form is ignored)."""
    return float(header) if header and header.isdigit() else None
