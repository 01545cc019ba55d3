"""The store as the seed system has it in the field.

``mnests`` without ``ts_weight`` and unique over its five key columns, ``events``,
``canonical_query_log`` and the view ``v_mnestoma``.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)

VIEW_0001 = (
    "CREATE VIEW v_mnestoma AS SELECT id, src_executor, src_version, dst_executor, "
    "dst_version, weight, uses, ts_first, ts_last, decay_lambda, state, tags, desired_sig "
    "FROM mnests WHERE state IN ('active', 'proto')"
)


def _name_check(column: str) -> str:
    return f"length(trim({column})) > 0 AND length({column}) <= 255"


def upgrade() -> None:
    op.create_table(
        "mnests",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("src_executor", sa.String(255), nullable=False),
        sa.Column("src_version", sa.String(255), nullable=False),
        sa.Column("dst_executor", sa.String(255), nullable=False),
        sa.Column("dst_version", sa.String(255), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("ts_first", TS, nullable=False),
        sa.Column("ts_last", TS, nullable=False),
        sa.Column("decay_lambda", sa.Float(), server_default=sa.text("0.018"), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tags", JSON, nullable=True),
        sa.Column("desired_sig", JSON, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mnests")),
        sa.CheckConstraint(
            "substr(id, 1, 3) = 'mn_' AND length(id) >= 15", name=op.f("ck_mnests_id_format")
        ),
        sa.CheckConstraint(
            _name_check("src_executor"), name=op.f("ck_mnests_src_executor_nonempty")
        ),
        sa.CheckConstraint(_name_check("src_version"), name=op.f("ck_mnests_src_version_nonempty")),
        sa.CheckConstraint(
            _name_check("dst_executor"), name=op.f("ck_mnests_dst_executor_nonempty")
        ),
        sa.CheckConstraint(
            "dst_version IS NULL OR (" + _name_check("dst_version") + ")",
            name=op.f("ck_mnests_dst_version_nonempty"),
        ),
        sa.CheckConstraint("weight >= 0 AND weight <= 1", name=op.f("ck_mnests_weight_range")),
        sa.CheckConstraint("uses >= 1", name=op.f("ck_mnests_uses_positive")),
        sa.CheckConstraint("ts_last >= ts_first", name=op.f("ck_mnests_ts_order")),
        sa.CheckConstraint("decay_lambda >= 0", name=op.f("ck_mnests_decay_lambda_nonneg")),
        sa.CheckConstraint(
            "state IN ('active', 'proto', 'decaying', 'superseded')",
            name=op.f("ck_mnests_state_known"),
        ),
        sa.CheckConstraint(
            "(state = 'proto' AND dst_version IS NULL)"
            " OR (state IN ('active', 'decaying') AND dst_version IS NOT NULL)"
            " OR state = 'superseded'",
            name=op.f("ck_mnests_proto_has_no_version"),
        ),
        sa.UniqueConstraint(
            "src_executor",
            "src_version",
            "dst_executor",
            "dst_version",
            "state",
            name=op.f("uq_mnests_edge"),
        ),
    )
    op.create_table(
        "events",
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("mnest_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("turn_id", sa.String(255), nullable=True),
        sa.Column("weight_before", sa.Float(), nullable=True),
        sa.Column("weight_after", sa.Float(), nullable=True),
        sa.Column("state_before", sa.String(16), nullable=True),
        sa.Column("state_after", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.CheckConstraint(
            "kind IN ('created', 'reinforced', 'transition', 'promoted', 'merged', 'pruned')",
            name=op.f("ck_events_kind_known"),
        ),
    )
    op.create_index("ix_events_mnest_id", "events", ["mnest_id"])
    op.create_table(
        "canonical_query_log",
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("turn_id", sa.String(255), nullable=True),
        sa.Column("raw_query", sa.Text(), nullable=False),
        sa.Column("canonical_query", sa.Text(), nullable=False),
        sa.Column("canonical_hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_canonical_query_log")),
        sa.CheckConstraint(
            "length(canonical_hash) = 64", name=op.f("ck_canonical_query_log_canonical_hash_sha256")
        ),
    )
    op.execute(VIEW_0001)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_mnestoma")
    op.drop_table("canonical_query_log")
    op.drop_index("ix_events_mnest_id", table_name="events")
    op.drop_table("events")
    op.drop_table("mnests")
