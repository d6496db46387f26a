"""``python -m services.ladybug.api``: serve CB-Ladybug's REST API (port 1470) until SIGTERM.

uvicorn handles SIGTERM/SIGINT itself: it stops accepting, lets requests in flight finish
(a blocking create waiting for its cluster is abandoned after ``timeout_graceful_shutdown``;
the cluster goes on), and runs the app's lifespan, which closes the clients.
"""

from __future__ import annotations

import uvicorn

from services.ladybug.api.app import SERVICE
from services.ladybug.api.bootstrap import build
from services.ladybug.api.settings import LadybugApiSettings
from shared.runtime import configure_logging

#: seconds a stopping server waits for requests in flight (blocking ones may wait far longer)
GRACEFUL_SHUTDOWN_SECONDS = 5


def main() -> None:
    settings = LadybugApiSettings()
    configure_logging(settings, SERVICE)
    tuning = settings.ladybug
    config = uvicorn.Config(
        build(settings),
        host=tuning.api_host,
        port=tuning.api_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
