"""Benchmarks of mnestoma against a hand-written ``sqlite3`` baseline.

Run ``python -m benchmarks`` from the repository root (``--quick`` for a smoke run,
``--postgresql URL`` to add PostgreSQL, ``--only NAME`` for one workload).
"""

from __future__ import annotations

__all__ = ["baseline", "data", "run", "workloads"]
