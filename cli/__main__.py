"""``python -m cli``: the same as the ``capibus`` console script."""

from cli.main import main

raise SystemExit(main())
