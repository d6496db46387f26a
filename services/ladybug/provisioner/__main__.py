"""``python -m services.ladybug.provisioner``: run one Ladybug provisioner replica until
SIGTERM."""

from services.ladybug.provisioner.app import SERVICE
from services.ladybug.provisioner.bootstrap import run
from services.ladybug.provisioner.settings import ProvisionerSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = ProvisionerSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
