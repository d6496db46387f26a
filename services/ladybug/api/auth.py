"""Who may call the API: a bearer token or basic auth, checked on every route but ``/healthy``.

Upstream's API has no authentication at all (``src/rest-api/server.go``); capibus's creates
VMs on the deployment's clouds, so it is never open: the credentials come from settings (a
Secret in a Deployment) and a request without a matching ``Authorization`` header gets 401
with a ``Status`` body and a challenge for both schemes. The FastAPI security classes are
used (without their own errors) so the OpenAPI document declares both schemes.
Comparisons are constant-time; a malformed basic header is a 401 like a wrong one.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import (
    HTTPAuthorizationCredentials,
    HTTPBasic,
    HTTPBasicCredentials,
    HTTPBearer,
)

from services.ladybug.api.errors import ApiError
from services.ladybug.api.ports import Credentials, Deps

bearer = HTTPBearer(auto_error=False, description="CAPIBUS_LADYBUG__API_TOKEN")
basic = HTTPBasic(
    auto_error=False,
    realm="ladybug",
    description="CAPIBUS_LADYBUG__API_USERNAME / CAPIBUS_LADYBUG__API_PASSWORD",
)
CHALLENGE = {"WWW-Authenticate": 'Basic realm="ladybug", Bearer'}


def accepts(
    credentials: Credentials,
    *,
    token: str | None = None,
    username: str | None = None,
    password: str | None = None,
) -> bool:
    """Whether the presented token, or user name and password, match ``credentials``."""
    expected = credentials.token
    if token is not None and expected and secrets.compare_digest(token.encode(), expected.encode()):
        return True
    if username is None or password is None:
        return False
    if not (credentials.username and credentials.password):
        return False
    user_ok = secrets.compare_digest(username.encode(), credentials.username.encode())
    password_ok = secrets.compare_digest(password.encode(), credentials.password.encode())
    return user_ok and password_ok


async def authenticated(
    *,
    request: Request,
    token: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    user: Annotated[HTTPBasicCredentials | None, Depends(basic)],
) -> None:
    """The route dependency: returns when the caller is authenticated, else 401."""
    deps: Deps = request.app.state.deps
    presented_token = token.credentials if token else None
    username, password = (user.username, user.password) if user else (None, None)
    if not accepts(deps.credentials, token=presented_token, username=username, password=password):
        raise ApiError(401, "Unauthorized", headers=CHALLENGE)
