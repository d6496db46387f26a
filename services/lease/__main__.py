"""``python -m services.lease``: run one lease service replica until SIGTERM."""

from services.lease.bootstrap import SERVICE, run
from services.lease.settings import LeaseSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = LeaseSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
