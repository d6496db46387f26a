"""``python -m bench``: throughput of the watcher and the writer, as ratios to bare baselines.

Every figure is measured twice in the same process run, on the same freshly started local
stack (``testenv.harness.LocalStack``): once by a *bare* loop that talks to the API server
directly, the best a Python client on this machine can do, and once through capibus (the
real service started as a subprocess, with JetStream in between). The ratio
candidate/baseline is what is reported against the target, so the numbers say how much of
the machine's capacity capibus keeps, not how fast the machine is. See ``bench/RESULTS.md``.
"""
