"""Hypothesis profiles for the property tests (``tests/unit/test_properties_*.py``).

``ci``, the default, is what ``make test`` and CI run:

* **reproducible**: ``derandomize=True`` draws the same examples on every run, so a red CI
  run is red again on a developer's machine, and a green one does not turn red by chance;
* **no example database** (``database=None``): a run does not depend on what an earlier one
  found. Hypothesis still caches what it learns of the code's constants and of Unicode; that
  goes to ``~/.cache/capibus/hypothesis`` (``HYPOTHESIS_STORAGE_DIRECTORY`` overrides it),
  not into a ``.hypothesis/`` folder of the checkout;
* **no deadline**: the machines are shared and slow at times, and a property about
  correctness must not fail because one example took long; the per-test timeout of
  ``pyproject.toml`` still bounds a test as a whole;
* **a budget**: 100 examples per property, which keeps the whole property suite well under
  30 s; a test that needs fewer (one that starts a consumer per example) lowers its own.

``explore`` is for a developer hunting: random seeds, ten times the examples
(``HYPOTHESIS_PROFILE=explore uv run --frozen pytest tests/unit/test_properties_*.py``).
Whatever it finds becomes an ``@example`` in the test, so ``ci`` checks it from then on.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
# Read when Hypothesis first stores something, after this module has run.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(_CACHE / "capibus" / "hypothesis"))

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    # Generating nested JSON is slow-ish by design; that is not a defect of the test.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore",
    max_examples=1000,
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
