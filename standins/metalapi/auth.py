"""HMAC verification as metal-api does it, through ``metal-stack/security`` ``mac.go``.

``HMACAuth.UserFromRequestData``: the ``Authorization`` header must be ``<type> <mac>``
with type ``Metal-Admin``; ``X-Date`` must parse as RFC 3339 and be no older than the
lifetime (15 s; a date in the future is accepted, as upstream); the MAC is recomputed as hex
HMAC-SHA256 over the date *re-formatted* as RFC 3339 UTC with whole seconds, then the
method, then ``X-Data-Salt``, with nothing between them. Messages are upstream's, so a
caller can tell a stale date ("too old") from a wrong key ("Wrong HMAC found").

Written apart from ``shared.metalapi.hmac_headers`` on purpose: if both sides shared one
function, a wrong concatenation would sign and verify alike and no test would notice. Both
are pinned to upstream's test vectors instead.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime

AUTH_TYPE = "Metal-Admin"


class AuthError(Exception):
    pass


def mac(key: str, moment: datetime, method: str, salt: str) -> str:
    stamp = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return hmac.new(key.encode(), (stamp + method + salt).encode(), hashlib.sha256).hexdigest()


def verify(
    key: str,
    method: str,
    headers: Mapping[str, str],
    *,
    now: datetime | None = None,
    lifetime: float = 15.0,
) -> None:
    """Raise ``AuthError`` unless ``headers`` carry a valid ``Metal-Admin`` HMAC."""
    auth = headers.get("Authorization", "")
    if not auth:
        raise AuthError("no auth found")
    parts = auth.split(" ")
    if len(parts) != 2:
        raise AuthError("illegal auth found")
    if parts[0].strip() != AUTH_TYPE:
        raise AuthError("unknown authtype found")
    stamp = headers.get("X-Date", "")
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError as exc:
        raise AuthError(
            f'unknown timestamp "{stamp}" in "X-Date" header, use RFC3339: {exc}'
        ) from exc
    if moment.tzinfo is None:
        raise AuthError(f'unknown timestamp "{stamp}" in "X-Date" header, use RFC3339')
    age = ((now or datetime.now(UTC)) - moment).total_seconds()
    if lifetime > 0 and age > lifetime:
        raise AuthError(
            f'the timestamp in your header is too old: "{stamp}", please check if you have '
            "time synchronization activated"
        )
    expected = mac(key, moment, method, headers.get("X-Data-Salt", ""))
    if not hmac.compare_digest(expected, parts[1].strip()):
        raise AuthError("Wrong HMAC found")
