"""The schema and its statements: the mapped models, every SQL statement (``schema.sql``),
the runner that executes them and the detached snapshots built from their rows."""
