"""The error vocabulary every service speaks.

Handlers never see a third-party exception: adapters (``shared.kube``, ``shared.bus``,
``shared.coordination``) catch what httpx, nats-py and redis raise and re-raise one of these,
chaining the original as ``__cause__``. The consumption helper maps the two retry classes onto
JetStream once, so no handler decides how to ack::

    CapibusError
    ├── TemporaryError          retry later: nak(delay), bounded by max deliveries
    │   ├── KubeUnavailable     connection refused/reset, 429, 5xx
    │   ├── KubeConflict        409: re-read and try again
    │   ├── BusUnavailable      NATS down or JetStream timing out
    │   └── LockUnavailable     Redis down: we cannot prove exclusivity, so we wait
    └── PermanentError          retrying cannot help: condition on the object + dead letter
        ├── KubeInvalid         422: the server rejected the content
        ├── KubeForbidden       401/403: credentials or RBAC are wrong
        ├── BadMessage          undecodable or schema-invalid message
        └── MessageTooLarge     a message over the bus's maximum payload

``KubeNotFound`` stands apart: a missing object is a fact handlers act on (drop the status
update, treat as deleted), not a failure of the run.
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
    """The API server is unreachable, overloaded (429) or failing (5xx)."""


class KubeConflict(TemporaryError):
    """Optimistic concurrency lost (409); re-read and converge again."""


class BusUnavailable(TemporaryError):
    """NATS or JetStream did not answer."""


class LockUnavailable(TemporaryError):
    """Redis did not answer, so exclusivity cannot be proven."""


class KubeInvalid(PermanentError):
    """The API server rejected the content (422)."""


class KubeForbidden(PermanentError):
    """The API server refused our credentials (401/403)."""


class BadMessage(PermanentError):
    """A message that cannot be decoded or does not match its contract."""


class MessageTooLarge(PermanentError):
    """A message larger than the NATS server accepts: sending it again cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="MessageTooLarge")


class KubeNotFound(CapibusError):
    """The object (or its kind) does not exist."""
