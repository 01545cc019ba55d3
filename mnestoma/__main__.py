"""``python -m mnestoma``: the same command line as the ``mnestoma`` script."""

from __future__ import annotations

from mnestoma.cli import main

if __name__ == "__main__":
    main()
