"""Decay speeds and weights are finite numbers in the database: non-finite ones are refused,
the largest finite speed decays at once, and 0004 mends what older stores held."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from conftest import mnest_row
from sqlalchemy import column, insert, table

import mnestoma
from mnestoma import Mnestoma
from mnestoma.schema.models import Mnest

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _raw_row(**overrides: object) -> dict[str, object]:
    return mnest_row(T0, **overrides)


@pytest.mark.parametrize(
    "column, value",
    [
        ("decay_lambda", math.inf),
        ("decay_lambda", math.nan),
        ("decay_lambda", -math.inf),
        ("decay_lambda", 1e301),
        ("weight", math.inf),
        ("weight", math.nan),
    ],
)
def test_the_database_refuses_non_finite_decay_speeds_and_weights(
    store: Mnestoma, column: str, value: float
) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), [_raw_row(**{column: value})])
    assert store.edges() == []


def test_the_largest_finite_decay_speed_is_accepted_and_decays_at_once(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    with store.engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), [_raw_row(decay_lambda=1e300)])
    clock.advance(seconds=1)
    assert store.suggest_next("a")[0][1] < 1e-80  # the SQL caps the exponent at 200
    assert store.apply_ager().to_decaying == 1


def test_upgrading_to_0004_mends_non_finite_decay_speeds(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0003")
    bad = {"mn_infinitespeed01": math.inf}
    engine = mnestoma.make_engine(empty_db_url)
    try:
        if engine.dialect.name == "postgresql":
            bad["mn_notanumberspeed"] = math.nan
        with engine.begin() as conn:
            for i, (mid, speed) in enumerate(bad.items()):
                row = _raw_row(id=mid, dst_executor=f"b{i}", decay_lambda=speed)
                # the columns 0003 has, without the model's defaults for later ones
                at_0003 = table("mnests", *(column(k) for k in row))
                conn.execute(insert(at_0003), [row])
    finally:
        engine.dispose()
    mnestoma.upgrade(empty_db_url)
    with Mnestoma(empty_db_url) as m:
        assert m.get("mn_infinitespeed01").decay_lambda == 1e300
        if "mn_notanumberspeed" in bad:
            assert m.get("mn_notanumberspeed").decay_lambda == 0.018
        assert math.isfinite(m.suggest_next("a")[0][1])
