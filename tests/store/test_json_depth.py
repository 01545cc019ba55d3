"""JSON nesting in ``tags`` and ``desired_sig`` is bounded at write; what is accepted reads back.

The limit is ``MAX_JSON_DEPTH`` container levels. Beyond it the value is ``InvalidInput`` (exit
status 2 on the command line), checked by an iterative walk: a structure 10,000 levels deep is
refused cleanly, never a ``RecursionError``. A value at the limit goes through every reader:
``get``, ``edges --json`` and a copy to the other engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

import mnestoma
from mnestoma.cli import cli
from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import MAX_JSON_DEPTH
from mnestoma.core.types import ensure_json
from mnestoma.engines import make_engine
from mnestoma.maintenance.copying import copy_store
from mnestoma.schema.models import Event, Mnest


def nested(levels: int, *, in_list: bool = False) -> Any:
    """A JSON value with exactly ``levels`` nested containers (dicts, or lists)."""
    value: Any = "leaf"
    for i in range(levels):
        value = [value, i] if in_list else {"k": value, "i": i}
    return value


def rows(url: str) -> tuple[int, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return (
                int(conn.execute(select(func.count()).select_from(Mnest.__table__)).scalar_one()),
                int(conn.execute(select(func.count()).select_from(Event.__table__)).scalar_one()),
            )
    finally:
        engine.dispose()


def test_the_limit_is_64_levels() -> None:
    assert MAX_JSON_DEPTH == 64


@pytest.mark.parametrize("in_list", [False, True])
def test_json_at_the_limit_is_accepted_and_one_level_more_is_refused(in_list: bool) -> None:
    assert ensure_json(nested(MAX_JSON_DEPTH, in_list=in_list), "desired_sig") is not None
    with pytest.raises(InvalidInput, match=f"nested more than {MAX_JSON_DEPTH} levels"):
        ensure_json(nested(MAX_JSON_DEPTH + 1, in_list=in_list), "desired_sig")


@pytest.mark.parametrize("levels", [1_000, 10_000, 100_000])
def test_very_deep_json_is_invalid_input_not_recursion_error(levels: int) -> None:
    with pytest.raises(InvalidInput, match="tags is nested more than"):
        ensure_json(nested(levels), "tags")


def test_a_structure_that_contains_itself_is_invalid_input() -> None:
    loop: list[Any] = []
    loop.append({"again": loop})
    with pytest.raises(InvalidInput, match="desired_sig is nested"):
        ensure_json(loop, "desired_sig")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1: "a"}, "keys must be strings"),
        ({"a": [1.0, float("nan")]}, "NaN or infinity"),
        ({"a": [{"b": {1, 2}}]}, "JSON-serialisable"),
        ({"a": ["x\x00y"]}, "NUL"),
        ({"\ud800": 1}, "lone surrogate"),
    ],
)
def test_the_other_json_rules_still_hold_deep_inside(value: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        ensure_json(value, "tags")


def test_deep_desired_sig_is_refused_by_the_store_and_nothing_is_written(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    for levels in (MAX_JSON_DEPTH + 1, 10_000):
        with pytest.raises(InvalidInput, match="desired_sig is nested"):
            store.record_passing("a", "1", "b", dst_exists=False, desired_sig=nested(levels))
        with pytest.raises(InvalidInput, match="tags is nested"):
            store.record_turn("t", [("a", "1", "c", "1", True, nested(levels))])
    assert rows(store_url) == (0, 0)


def test_desired_sig_at_the_limit_is_stored_and_read_back(store: mnestoma.Mnestoma) -> None:
    sig = nested(MAX_JSON_DEPTH)
    tags = nested(MAX_JSON_DEPTH, in_list=True)
    m = store.record_passing("a", "1", "b", dst_exists=False, tags=tags, desired_sig=sig)
    got = store.get(m.id)
    assert got is not None
    assert got.desired_sig == sig
    assert got.tags == json.loads(json.dumps(tags))


def test_record_sig_too_deep_exits_2_with_one_line(store_url: str) -> None:
    for levels in (MAX_JSON_DEPTH + 1, 10_000):
        result = CliRunner().invoke(
            cli,
            [
                "record",
                "a@1",
                "b",
                "--proto",
                "--sig",
                '{"deep": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}",
                "--database-url",
                store_url,
            ],
        )
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.output
    assert rows(store_url) == (0, 0)


def test_record_sig_at_the_limit_is_recorded_and_listed(store_url: str) -> None:
    sig = {"deep": nested(MAX_JSON_DEPTH - 1)}
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["record", "a@1", "b", "--proto", "--sig", json.dumps(sig), "--database-url", store_url],
    )
    assert result.exit_code == 0, result.output
    listed = runner.invoke(cli, ["edges", "--json", "--database-url", store_url])
    assert listed.exit_code == 0, listed.output
    assert [r["desired_sig"] for r in json.loads(listed.stdout)] == [sig]


def test_a_store_holding_json_at_the_limit_copies_to_the_other_engine_and_back(
    tmp_path: Path, empty_db_url: str
) -> None:
    source, back = f"sqlite:///{tmp_path / 'deep.sqlite'}", f"sqlite:///{tmp_path / 'back.sqlite'}"
    sig = nested(MAX_JSON_DEPTH)
    tags = nested(MAX_JSON_DEPTH, in_list=True)
    with mnestoma.Mnestoma(source) as m:
        proto = m.record_passing("a", "1", "b", dst_exists=False, tags=tags, desired_sig=sig)
    copy_store(source, empty_db_url)
    copy_store(empty_db_url, back)
    for url in (empty_db_url, back):
        with mnestoma.Mnestoma(url) as m:
            got = m.get(proto.id)
        assert got is not None
        assert got.desired_sig == sig
        assert got.tags == json.loads(json.dumps(tags))
