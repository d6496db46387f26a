"""``python -m services.admission``: serve the admission webhooks until SIGTERM."""

from services.admission.bootstrap import SERVICE, run
from services.admission.settings import AdmissionSettings
from shared.runtime import configure_logging, run_until_signalled


def main() -> None:
    settings = AdmissionSettings()  # cert and key come from the environment
    configure_logging(settings, SERVICE)
    run_until_signalled(lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
