"""The one error type a handler raises: an HTTP code and upstream's ``Status`` message.

Upstream answers every failure with ``app.Status`` (``{"kind":"Status","code":…,"message":…}``,
``src/core/app/ack.go``) and the code it chose per route; handlers say which code and the app
renders the body, so no handler builds a response for a failure.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, code: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}
