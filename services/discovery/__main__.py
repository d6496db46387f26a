"""``python -m services.discovery``: run one discovery replica until SIGTERM."""

from services.discovery.bootstrap import SERVICE, run
from services.discovery.settings import DiscoverySettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = DiscoverySettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
