"""``python -m services.catalog``: run one catalog replica until SIGTERM."""

from services.catalog.bootstrap import SERVICE, run
from services.catalog.settings import CatalogSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = CatalogSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
