"""A store that a migration must not touch: named by MNESTOMA_DATABASE_URL while a test
hands the migrations another database."""

from __future__ import annotations

from sqlalchemy import text

import mnestoma
from mnestoma.engines import make_engine

Snapshot = tuple[str | None, list[tuple[str, int, int, int]], list[tuple[str, str]]]


def fill_bystander(url: str) -> Snapshot:
    """Give the store at ``url`` a row whose outcome counts a downgrade to 0007 would lose,
    and return what it holds."""
    m = mnestoma.Mnestoma(url)
    try:
        m.record_passing("search", "1", "read", "2", outcome="ok")
        m.record_passing("search", "1", "read", "2", outcome="error")
    finally:
        m.close()
    return snapshot(url)


# What any revision run on the store changes, even one undone by the next: SQLite's table
# pages (a batch rebuild moves them), PostgreSQL's row version of the stamp (each UPDATE
# writes a new one, with its own xmin).
MARKS = {
    "sqlite": "SELECT name, CAST(rootpage AS TEXT) FROM sqlite_master ORDER BY name",
    "postgresql": "SELECT version_num, xmin::text FROM mnestoma_alembic_version",
}


def snapshot(url: str) -> Snapshot:
    """The revision of the store at ``url``, its rows' counts, and the marks a revision
    run on it would leave."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, uses, ok_count, error_count FROM mnests ORDER BY id")
            )
            counts = [(str(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in rows]
            marks = [(str(a), str(b)) for a, b in conn.execute(text(MARKS[conn.dialect.name]))]
        return mnestoma.current_revision(engine), counts, marks
    finally:
        engine.dispose()
