"""``python -m services.monitor``: run one monitor replica until SIGTERM."""

from services.monitor.bootstrap import SERVICE, run
from services.monitor.settings import MonitorSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = MonitorSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
