"""The turn-id index holds only events that have a turn.

``ix_events_turn_id`` indexed every event, NULL turn ids included: the ager's events (and
any recorded without a turn) each wrote an index entry nothing ever looks up. The index
becomes partial, ``WHERE turn_id IS NOT NULL``; the lookups by turn (``turn_id = :turn_id``)
imply that predicate and use it as before, on both engines. Same name; a plain drop and
create, no table rebuild.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_events_turn_id"
HAS_TURN = "turn_id IS NOT NULL"


def upgrade() -> None:
    op.drop_index(INDEX, table_name="events")
    op.create_index(
        INDEX,
        "events",
        ["turn_id"],
        sqlite_where=sa.text(HAS_TURN),
        postgresql_where=sa.text(HAS_TURN),
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="events")
    op.create_index(INDEX, "events", ["turn_id"])
