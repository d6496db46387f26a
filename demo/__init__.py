"""The foundation-stage demo of capibus; run it with ``python -m demo`` (see ``__main__``)."""
