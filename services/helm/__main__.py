"""``python -m services.helm``: run one helm-service replica until SIGTERM."""

from services.helm.bootstrap import SERVICE, run
from services.helm.settings import HelmSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = HelmSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
