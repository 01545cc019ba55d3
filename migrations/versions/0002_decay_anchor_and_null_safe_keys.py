"""Decay anchor, NULL-safe edge keys, turn idempotency and the indexes the rules need.

- ``mnests.ts_weight`` (the instant ``weight`` refers to), backfilled from ``ts_last``;
- the five-column unique constraint becomes two partial unique indexes, so that at most
  one proto exists per (src, src_version, dst, state) and an upsert can target either;
- ``events.reason`` and ``events.related_id``; one (turn_id, mnest_id) per created or
  reinforced event, so that a retried turn counts once;
- indexes for walk, suggest_next, events by turn and the query log.

SQLite cannot alter a table in place: the batch blocks recreate ``mnests``, and the view that
refers to it is dropped before and created again after.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
VIEW_0001 = (
    "CREATE VIEW v_mnestoma AS SELECT id, src_executor, src_version, dst_executor, "
    "dst_version, weight, uses, ts_first, ts_last, decay_lambda, state, tags, desired_sig "
    "FROM mnests WHERE state IN ('active', 'proto')"
)
VIEW_0002 = (
    "CREATE VIEW v_mnestoma AS SELECT id, src_executor, src_version, dst_executor, "
    "dst_version, weight, uses, ts_first, ts_last, ts_weight, decay_lambda, state, tags, "
    "desired_sig FROM mnests WHERE state IN ('active', 'proto')"
)
TURN_EDGE_WHERE = "turn_id IS NOT NULL AND kind IN ('created', 'reinforced')"
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _name_check(column: str) -> str:
    return f"length(trim({column})) > 0 AND length({column}) <= 255"


def _mnests_table(*, ts_weight_nullable: bool, with_unique: bool) -> sa.Table:
    """``mnests`` as it stands when a batch block starts: batch mode copies from it instead
    of reflecting, so the offline SQL script (``--sql``) works on SQLite too."""
    md = sa.MetaData()
    extra: list[sa.SchemaItem] = []
    if with_unique:
        extra.append(
            sa.UniqueConstraint(
                "src_executor",
                "src_version",
                "dst_executor",
                "dst_version",
                "state",
                name="uq_mnests_edge",
            )
        )
    return sa.Table(
        "mnests",
        md,
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
        sa.Column("ts_weight", TS, nullable=ts_weight_nullable),
        sa.PrimaryKeyConstraint("id", name="pk_mnests"),
        sa.CheckConstraint(
            "substr(id, 1, 3) = 'mn_' AND length(id) >= 15", name="ck_mnests_id_format"
        ),
        sa.CheckConstraint(_name_check("src_executor"), name="ck_mnests_src_executor_nonempty"),
        sa.CheckConstraint(_name_check("src_version"), name="ck_mnests_src_version_nonempty"),
        sa.CheckConstraint(_name_check("dst_executor"), name="ck_mnests_dst_executor_nonempty"),
        sa.CheckConstraint(
            "dst_version IS NULL OR (" + _name_check("dst_version") + ")",
            name="ck_mnests_dst_version_nonempty",
        ),
        sa.CheckConstraint("weight >= 0 AND weight <= 1", name="ck_mnests_weight_range"),
        sa.CheckConstraint("uses >= 1", name="ck_mnests_uses_positive"),
        sa.CheckConstraint("ts_last >= ts_first", name="ck_mnests_ts_order"),
        sa.CheckConstraint("decay_lambda >= 0", name="ck_mnests_decay_lambda_nonneg"),
        sa.CheckConstraint(
            "state IN ('active', 'proto', 'decaying', 'superseded')", name="ck_mnests_state_known"
        ),
        sa.CheckConstraint(
            "(state = 'proto' AND dst_version IS NULL)"
            " OR (state IN ('active', 'decaying') AND dst_version IS NOT NULL)"
            " OR state = 'superseded'",
            name="ck_mnests_proto_has_no_version",
        ),
        *extra,
    )


def _events_table() -> sa.Table:
    """``events`` at head, for the downgrade's batch block."""
    md = sa.MetaData()
    return sa.Table(
        "events",
        md,
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("mnest_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("turn_id", sa.String(255), nullable=True),
        sa.Column("weight_before", sa.Float(), nullable=True),
        sa.Column("weight_after", sa.Float(), nullable=True),
        sa.Column("state_before", sa.String(16), nullable=True),
        sa.Column("state_after", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("related_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.CheckConstraint(
            "kind IN ('created', 'reinforced', 'transition', 'promoted', 'merged', 'pruned')",
            name="ck_events_kind_known",
        ),
        sa.Index("ix_events_mnest_id", "mnest_id"),
    )


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_mnestoma")

    op.add_column("mnests", sa.Column("ts_weight", TS, nullable=True))
    op.execute("UPDATE mnests SET ts_weight = ts_last")
    with op.batch_alter_table(
        "mnests",
        naming_convention=NAMING,
        copy_from=_mnests_table(ts_weight_nullable=True, with_unique=True),
    ) as batch:
        batch.alter_column("ts_weight", existing_type=TS, nullable=False)
        batch.drop_constraint("uq_mnests_edge", type_="unique")
    op.create_index(
        "ux_mnests_edge_key",
        "mnests",
        ["src_executor", "src_version", "dst_executor", "dst_version", "state"],
        unique=True,
        sqlite_where=sa.text("dst_version IS NOT NULL"),
        postgresql_where=sa.text("dst_version IS NOT NULL"),
    )
    op.create_index(
        "ux_mnests_proto_key",
        "mnests",
        ["src_executor", "src_version", "dst_executor", "state"],
        unique=True,
        sqlite_where=sa.text("dst_version IS NULL"),
        postgresql_where=sa.text("dst_version IS NULL"),
    )
    op.create_index("ix_mnests_state_src", "mnests", ["state", "src_executor", "src_version"])
    op.create_index("ix_mnests_dst_executor", "mnests", ["dst_executor"])

    op.add_column("events", sa.Column("reason", sa.Text(), nullable=True))
    op.add_column("events", sa.Column("related_id", sa.String(64), nullable=True))
    op.create_index("ix_events_turn_id", "events", ["turn_id"])
    op.create_index(
        "ux_events_turn_edge",
        "events",
        ["turn_id", "mnest_id"],
        unique=True,
        sqlite_where=sa.text(TURN_EDGE_WHERE),
        postgresql_where=sa.text(TURN_EDGE_WHERE),
    )

    op.create_index(
        "ix_canonical_query_log_canonical_hash", "canonical_query_log", ["canonical_hash"]
    )
    op.create_index("ix_canonical_query_log_ts", "canonical_query_log", ["ts"])

    op.execute(VIEW_0002)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_mnestoma")

    op.drop_index("ix_canonical_query_log_ts", table_name="canonical_query_log")
    op.drop_index("ix_canonical_query_log_canonical_hash", table_name="canonical_query_log")

    op.drop_index("ux_events_turn_edge", table_name="events")
    op.drop_index("ix_events_turn_id", table_name="events")
    with op.batch_alter_table(
        "events", naming_convention=NAMING, copy_from=_events_table()
    ) as batch:
        batch.drop_column("related_id")
        batch.drop_column("reason")

    op.drop_index("ix_mnests_dst_executor", table_name="mnests")
    op.drop_index("ix_mnests_state_src", table_name="mnests")
    op.drop_index("ux_mnests_proto_key", table_name="mnests")
    op.drop_index("ux_mnests_edge_key", table_name="mnests")
    # 0001 decays from ts_last: re-anchor each weight there (clamped) before the anchor goes.
    if op.get_bind().dialect.name == "postgresql":
        days = "EXTRACT(EPOCH FROM (ts_weight - ts_last)) / 86400.0"
        op.execute(f"UPDATE mnests SET weight = LEAST(1.0, weight * exp(decay_lambda * {days}))")
    else:
        days = "(julianday(ts_weight) - julianday(ts_last))"
        op.execute(f"UPDATE mnests SET weight = min(1.0, weight * exp(decay_lambda * {days}))")
    with op.batch_alter_table(
        "mnests",
        naming_convention=NAMING,
        copy_from=_mnests_table(ts_weight_nullable=False, with_unique=False),
    ) as batch:
        batch.drop_column("ts_weight")
        batch.create_unique_constraint(
            "uq_mnests_edge",
            ["src_executor", "src_version", "dst_executor", "dst_version", "state"],
        )

    op.execute(VIEW_0001)
