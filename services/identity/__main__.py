"""``python -m services.identity``: run one identity replica until SIGTERM."""

from services.identity.bootstrap import SERVICE, run
from services.identity.settings import IdentitySettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = IdentitySettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
