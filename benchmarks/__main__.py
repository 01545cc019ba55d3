"""``python -m benchmarks``: run the benchmark suite and print its table."""

from __future__ import annotations

from .run import main

if __name__ == "__main__":
    raise SystemExit(main())
