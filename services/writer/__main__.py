"""``python -m services.writer``: run one writer replica until SIGTERM."""

from services.writer.bootstrap import SERVICE, run
from services.writer.settings import WriterSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = WriterSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
