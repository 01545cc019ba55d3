"""Active edges by source in a partial index; room on mnests pages for updates (PostgreSQL).

``ix_mnests_state_src (state, src_executor, src_version)`` indexed every row, whatever its
state, though only active rows are ever looked up by source (the walk, ``suggest_next``,
ranking). It becomes ``ix_mnests_active_src (src_executor, src_version) WHERE state =
'active'``: a row that leaves ``active`` (the ager's demotions) writes no entry in it, and
the lookups by source, which name the state as a literal, use it on both engines.

PostgreSQL: ``mnests`` gets ``fillfactor = 70``. Every row of it is rewritten by each ager
run and each passing reinforces one; an update that finds room on its page and changes no
indexed column stays there (HOT) and writes no index entry. Only new pages are filled to
70 %: existing rows move as they are updated (``VACUUM FULL mnests`` applies it at once,
under an exclusive lock). SQLite has no such setting.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "ix_mnests_state_src"
NEW = "ix_mnests_active_src"
ACTIVE = "state = 'active'"


def _postgresql() -> bool:
    return bool(op.get_context().dialect.name == "postgresql")


def upgrade() -> None:
    op.drop_index(OLD, table_name="mnests")
    op.create_index(
        NEW,
        "mnests",
        ["src_executor", "src_version"],
        sqlite_where=sa.text(ACTIVE),
        postgresql_where=sa.text(ACTIVE),
    )
    if _postgresql():
        op.execute("ALTER TABLE mnests SET (fillfactor = 70)")


def downgrade() -> None:
    if _postgresql():
        op.execute("ALTER TABLE mnests RESET (fillfactor)")
    op.drop_index(NEW, table_name="mnests")
    op.create_index(OLD, "mnests", ["state", "src_executor", "src_version"])
