"""What the tests of the ager's runs share: a stopped clock and a store as the ager's worst
case meets it (mostly demoting, with twins), loaded in one statement."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert

from mnestoma.core.rules import new_mnest_id
from mnestoma.schema.models import Mnest

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class StoppedClock:
    """A clock that says ``now`` until told otherwise."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def demoting_store(n: int, *, seed: int = 3, twins: int = 0) -> list[dict[str, Any]]:
    """``n`` rows as the ager's worst case meets them: 90 % active, 10 % proto, weights
    uniform in [0, 1], anchored 30 to 430 days before T0 (about 93 % change state); plus
    ``twins`` decaying rows sharing the key of an active row that demotes (merges), and
    a few rows anchored after T0 (a clock that went back)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ts = T0 - timedelta(days=rng.uniform(30, 430))
        if i % 50 == 7:
            ts = T0 + timedelta(hours=rng.uniform(1, 48))
        proto = i % 10 == 9
        rows.append(
            {
                "id": new_mnest_id(),
                "src_executor": f"s{i}",
                "src_version": "1",
                "dst_executor": f"d{i}",
                "dst_version": None if proto else "1",
                "weight": rng.random(),
                "uses": rng.randint(1, 40),
                "ts_first": ts - timedelta(days=rng.randint(0, 30)),
                "ts_last": ts,
                "ts_weight": ts,
                "decay_lambda": 0.018,
                "state": "proto" if proto else "active",
            }
        )
    actives = [r for r in rows if r["state"] == "active"]
    for r in rng.sample(actives, twins):
        r["weight"] = min(r["weight"], 0.1)  # below 0.20 at T0: it demotes, into its twin
        old = r["ts_first"] - timedelta(days=rng.uniform(1, 200))
        rows.append(
            {
                **r,
                "id": new_mnest_id(),
                "weight": rng.uniform(0.0, 0.3),
                "uses": rng.randint(1, 10),
                "ts_first": old,
                "ts_last": old,
                "ts_weight": old,
                "state": "decaying",
            }
        )
    return rows


def load(engine: Engine, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``mnests`` as they are, in one statement."""
    with engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), rows)
