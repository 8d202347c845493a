"""pgjobs benchmarks: ``python -m bench`` (or ``pgjobs bench``).

Each suite (``core``, ``worker``, ``workflows``, ``fairness``, ``recurring``) is a module with
``run(dsn, quick=False) -> dict`` and runs in a database created for it alone; see
:mod:`bench.common` for the shape of the dict and the helpers, and :mod:`bench.__main__` for the
command line.
"""

SUITES = ("core", "worker", "workflows", "fairness", "recurring")
# Run only when named (``--only stream``): the worker suite's subscriber rows alone, with more rounds; ``caps``:
# capped queues at the cap's speed (bench/caps.py); ``rate_limits``: rate limits at the limit's speed
# (bench/rate_limits.py).
EXTRA_SUITES = ("stream", "caps", "rate_limits")
