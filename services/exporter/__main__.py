"""``python -m services.exporter``: run one exporter replica until SIGTERM."""

from services.exporter.bootstrap import SERVICE, run
from services.exporter.settings import ExporterSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = ExporterSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
