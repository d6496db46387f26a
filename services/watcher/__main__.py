"""``python -m services.watcher``: run one watcher replica until SIGTERM."""

from services.watcher.bootstrap import SERVICE, run
from services.watcher.settings import WatcherSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = WatcherSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
