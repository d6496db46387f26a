"""``python -m services.baremetal.assisted_bootstrap``: run one bootstrap provider replica until
SIGTERM."""

from services.baremetal.assisted_bootstrap.app import SERVICE
from services.baremetal.assisted_bootstrap.bootstrap import run
from services.baremetal.assisted_bootstrap.settings import AssistedBootstrapSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = AssistedBootstrapSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
