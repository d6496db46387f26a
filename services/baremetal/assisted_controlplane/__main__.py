"""``python -m services.baremetal.assisted_controlplane``: run one replica until SIGTERM."""

from services.baremetal.assisted_controlplane.app import SERVICE
from services.baremetal.assisted_controlplane.bootstrap import run
from services.baremetal.assisted_controlplane.settings import AssistedControlPlaneSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = AssistedControlPlaneSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
