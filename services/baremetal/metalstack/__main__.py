"""``python -m services.baremetal.metalstack``: run one metal-stack provider replica until
SIGTERM."""

from services.baremetal.metalstack.app import SERVICE
from services.baremetal.metalstack.bootstrap import run
from services.baremetal.metalstack.settings import MetalStackSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = MetalStackSettings()
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
