"""The rules as pure functions, checked without a database."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnestoma.core import rules
from mnestoma.core.rules import MnestState, check_transition, decayed_weight, reinforced_weight

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_contract_numbers() -> None:
    assert rules.INITIAL_WEIGHT == 0.30
    assert rules.REINFORCEMENT == 0.15
    assert rules.DEFAULT_DECAY_LAMBDA == 0.018
    assert rules.DECAYING_BELOW == 0.20
    assert rules.PROTO_PRUNE_BELOW == 0.05
    assert rules.ARCHIVE_BELOW == 0.05
    assert rules.ARCHIVE_AFTER_DAYS == 90
    assert rules.RECURRING_MIN_USES == 3
    assert rules.RECURRING_MIN_WEIGHT == 0.30


def test_decay_follows_exp_of_minus_lambda_days() -> None:
    assert decayed_weight(0.5, 0.018, T0, T0 + timedelta(days=10)) == pytest.approx(
        0.5 * math.exp(-0.18)
    )


def test_decay_counts_fractions_of_a_day() -> None:
    assert decayed_weight(1.0, 0.018, T0, T0 + timedelta(hours=12)) == pytest.approx(
        math.exp(-0.009)
    )


def test_a_clock_that_steps_back_decays_nothing() -> None:
    assert decayed_weight(0.4, 0.018, T0, T0 - timedelta(days=3)) == 0.4


def test_reinforcement_adds_015_to_the_decayed_weight() -> None:
    assert reinforced_weight(0.3, 0.018, T0, T0 + timedelta(days=2)) == pytest.approx(
        0.3 * math.exp(-0.036) + 0.15
    )


def test_reinforcement_is_clamped_to_one() -> None:
    assert reinforced_weight(0.95, 0.018, T0, T0) == 1.0


def test_a_new_id_is_mn_and_a_long_url_safe_token() -> None:
    ident = rules.new_mnest_id()
    assert ident.startswith("mn_")
    token = ident[3:]
    assert len(token) >= 12
    assert all(c.isalnum() or c in "-_" for c in token)
    assert rules.new_mnest_id() != ident


@given(
    w=st.floats(0, 1),
    lam=st.floats(0, 1),
    d1=st.floats(0, 400),
    d2=st.floats(0, 400),
)
def test_decay_in_two_steps_equals_decay_in_one(w: float, lam: float, d1: float, d2: float) -> None:
    t1 = T0 + timedelta(days=d1)
    t2 = t1 + timedelta(days=d2)
    once = decayed_weight(w, lam, T0, t2)
    twice = decayed_weight(decayed_weight(w, lam, T0, t1), lam, t1, t2)
    assert twice == pytest.approx(once, rel=1e-9, abs=1e-15)


@given(w=st.floats(0, 1), lam=st.floats(0, 5), d=st.floats(0, 10_000))
def test_weights_stay_in_zero_one(w: float, lam: float, d: float) -> None:
    now = T0 + timedelta(days=d)
    assert 0.0 <= decayed_weight(w, lam, T0, now) <= w
    assert 0.0 <= reinforced_weight(w, lam, T0, now) <= 1.0


_A, _D, _S, _P = MnestState.ACTIVE, MnestState.DECAYING, MnestState.SUPERSEDED, MnestState.PROTO
# (current, target, has_version): the moves the rules allow, then some they refuse
ALLOWED = [(_A, _D, True), (_A, _S, True), (_D, _A, True), (_S, _A, True), (_P, _S, False)]
ALLOWED.append((_A, _A, True))  # to the state it is in
REFUSED = [(_P, _A, False), (_P, _D, False), (_A, _P, True), (_D, _P, True), (_S, _P, True)]
REFUSED.append((_S, _A, False))  # back to active: only with a version


@pytest.mark.parametrize(
    ("current", "target", "has_version", "allowed"),
    [(*move, True) for move in ALLOWED] + [(*move, False) for move in REFUSED],
)
def test_the_transition_table(
    current: MnestState, target: MnestState, has_version: bool, allowed: bool
) -> None:
    assert (check_transition(current, target, has_version=has_version) is None) is allowed


# --- the timestamp anchor and the ager as pure functions --------------------------------------

NOW = T0 + timedelta(days=100)


def _row(ident: str, state: str, weight: float, *, dst_version: str | None = "1", **kw) -> dict:
    """A plain row as a mapping, the way a caller (or a test reading the database) has it."""
    values = {
        "id": ident,
        "src_executor": "a",
        "src_version": "1",
        "dst_executor": "b" if dst_version is not None else "wish",
        "dst_version": dst_version,
        "state": state,
        "weight": weight,
        "uses": 1,
        "ts_first": T0,
        "ts_last": T0,
        "ts_weight": T0,
        "decay_lambda": rules.DEFAULT_DECAY_LAMBDA,
        "tags": {"ignored": True},
    }
    return values | kw


_T0 = datetime(2026, 3, 1, tzinfo=UTC)
_gap_days = st.one_of(
    st.floats(-400, 400), st.floats(0, 1e-6), st.sampled_from([0.0, 365.0 * 2900])
)


@given(
    weight=st.one_of(st.floats(0, 1), st.sampled_from([0.0, 5e-324, 1e-101, 1.0])),
    count=st.one_of(st.floats(0, 1e6), st.sampled_from([0.0, 1.0, 5e-324])),
    lam=st.one_of(
        st.floats(0, 1e300), st.sampled_from([0.0, 5e-324, 1e-151, rules.DEFAULT_DECAY_LAMBDA])
    ),
    since_weight=_gap_days,
    since_last=st.one_of(st.just(None), _gap_days),
)
def test_a_passing_s_values_are_the_three_rules_bit_for_bit(
    weight: float,
    count: float,
    lam: float,
    since_weight: float,
    since_last: float | None,
) -> None:
    """passing_values, with its one exponential where both instants are the same (None:
    ts_last is ts_weight), gives the floats of decayed_weight, reinforce and counted_passing."""
    now = _T0 + timedelta(days=2900 * 365)
    ts_weight = now - timedelta(days=since_weight)
    ts_last = ts_weight if since_last is None else now - timedelta(days=since_last)
    before = decayed_weight(weight, lam, ts_weight, now)
    want = (before, rules.reinforce(before), rules.counted_passing(count, lam, ts_last, now))
    got = rules.passing_values(weight, count, lam, ts_weight, ts_last, now)
    assert [x.hex() for x in got] == [x.hex() for x in want]


def test_advance_moves_a_timestamp_to_now_but_never_backwards() -> None:
    assert rules.advance(T0, NOW) == NOW
    assert rules.advance(NOW, T0) == NOW
    assert rules.advance(T0, T0) == T0


def test_the_threshold_cut_is_a_hair_below_the_threshold() -> None:
    cut = rules.threshold_cut(rules.DECAYING_BELOW)
    assert cut == rules.DECAYING_BELOW - rules.THRESHOLD_TOLERANCE
    assert not rules.is_below(rules.DECAYING_BELOW, rules.DECAYING_BELOW)
    assert not rules.is_below(cut, rules.DECAYING_BELOW)
    assert rules.is_below(math.nextafter(cut, 0.0), rules.DECAYING_BELOW)


def test_the_ager_decays_a_live_row_to_now() -> None:
    for state in rules.LIVE_STATES:
        d = rules.ager_decision(state, 0.9, 0.018, T0, T0, T0 + timedelta(days=10))
        assert d.action == rules.AgerAction.DECAY
        assert (d.state, d.ts_weight) == (state, T0 + timedelta(days=10))
        assert d.weight == d.effective == pytest.approx(0.9 * math.exp(-0.18))


def test_the_ager_leaves_a_live_row_already_at_now_or_ahead_of_it() -> None:
    assert rules.ager_decision("active", 0.9, 0.018, T0, T0, T0).action == rules.AgerAction.KEEP
    ahead = rules.ager_decision("proto", 0.9, 0.018, NOW, NOW, T0)  # the clock stepped back
    assert (ahead.action, ahead.weight, ahead.ts_weight) == (rules.AgerAction.KEEP, 0.9, NOW)


def test_the_ager_demotes_an_active_row_below_020_at_its_effective_weight() -> None:
    d = rules.ager_decision("active", 0.30, 0.018, T0, T0, T0 + timedelta(days=23))
    assert (d.action, d.state) == (rules.AgerAction.DEMOTE, MnestState.DECAYING)
    assert d.weight == d.effective == pytest.approx(0.30 * math.exp(-0.018 * 23))
    assert d.ts_weight == T0 + timedelta(days=23)
    assert not d.archive_candidate


def test_a_demotion_anchors_ts_weight_at_the_later_of_ts_weight_and_now() -> None:
    d = rules.ager_decision("active", 0.1, 0.018, NOW, T0, T0)
    assert (d.action, d.weight, d.ts_weight) == (rules.AgerAction.DEMOTE, 0.1, NOW)


def test_a_weight_exactly_at_a_threshold_is_not_below_it() -> None:
    assert rules.ager_decision("active", 0.20, 0.018, NOW, T0, NOW).action == "keep"
    assert rules.ager_decision("proto", 0.05, 0.018, NOW, T0, NOW).action == "keep"


def test_the_ager_prunes_a_proto_below_005() -> None:
    d = rules.ager_decision("proto", 0.30, 0.018, T0, T0, T0 + timedelta(days=100))
    assert d.action == rules.AgerAction.PRUNE
    assert d.effective == pytest.approx(0.30 * math.exp(-1.8))


def test_the_ager_keeps_the_stored_weight_of_decaying_and_superseded_rows() -> None:
    for state in ("decaying", "superseded"):
        d = rules.ager_decision(state, 0.3, 0.018, T0, T0, T0 + timedelta(days=30))
        assert (d.action, d.weight, d.ts_weight) == (rules.AgerAction.KEEP, 0.3, T0)
        assert d.effective == pytest.approx(0.3 * math.exp(-0.54))


def test_an_archive_candidate_is_decaying_below_005_and_90_days_unused() -> None:
    weak = 0.3 * math.exp(-0.018 * 100)  # below 0.05 after 100 days
    assert rules.ager_decision("decaying", 0.3, 0.018, T0, T0, NOW).archive_candidate
    recent = T0 + timedelta(days=10, seconds=1)  # 89.99… days before NOW
    assert not rules.ager_decision("decaying", 0.3, 0.018, T0, recent, NOW).archive_candidate
    on_the_day = NOW - timedelta(days=90)
    assert rules.ager_decision("decaying", 0.3, 0.018, T0, on_the_day, NOW).archive_candidate
    assert not rules.ager_decision("decaying", 0.06, 0.0, T0, T0, NOW).archive_candidate
    assert not rules.ager_decision("superseded", weak, 0.0, T0, T0, NOW).archive_candidate
    demoted = rules.ager_decision("active", 0.3, 0.018, T0, T0, NOW)
    assert demoted.action == rules.AgerAction.DEMOTE and demoted.archive_candidate


def test_a_demoted_row_merges_into_its_decaying_twin() -> None:
    later = T0 + timedelta(days=5)
    active = rules.AgerRow.of(
        _row("mn_a", "active", 0.30, uses=2, ts_first=later, ts_last=later, ts_weight=later)
    )
    decaying = rules.AgerRow.of(
        _row("mn_d", "decaying", 0.45, uses=3, ts_last=T0 + timedelta(days=1))
    )
    merged = rules.merge_demoted(active, decaying, NOW)
    assert merged.id == "mn_d" and merged.state == MnestState.DECAYING
    assert (merged.uses, merged.ts_first, merged.ts_last) == (5, T0, later)
    assert merged.weight == pytest.approx(max(0.30 * math.exp(-0.018 * 95), 0.45 * math.exp(-1.8)))
    assert merged.ts_weight == NOW
    ahead = rules.merge_demoted(active, decaying, T0)  # a clock behind the twin's ts_weight
    assert ahead.ts_weight == T0 and ahead.weight == 0.45


def test_ager_rows_are_read_from_mappings_ignoring_other_columns() -> None:
    row = rules.AgerRow.of(_row("mn_x", "proto", 0.5, dst_version=None))
    assert row.state is MnestState.PROTO
    assert row.key == ("a", "1", "wish", None)
    assert rules.AgerRow.of(row) is row


def test_age_prunes_merges_demotes_decays_and_counts_like_the_contract() -> None:
    fresh = NOW - timedelta(hours=1)
    rows = [
        _row("mn_p_dead", "proto", 0.30, dst_version=None),
        _row("mn_p_live", "proto", 0.90, dst_version=None, src_version="2", ts_weight=fresh),
        _row("mn_a_twin", "active", 0.30, uses=2),
        _row("mn_d_twin", "decaying", 0.25, uses=4),
        _row("mn_a_weak", "active", 0.30, dst_version="2"),
        _row("mn_a_ok", "active", 0.90, dst_version="3", ts_weight=fresh),
        _row("mn_a_now", "active", 0.90, dst_version="4", ts_weight=NOW),
        _row("mn_s", "superseded", 0.01, dst_version="5"),
    ]
    left, report = rules.age(rows, NOW)
    assert report == rules.AgerReport(
        decayed=2, to_decaying=2, merged=1, protos_pruned=1, archive_candidates=2
    )
    by_id = {r.id: r for r in left}
    assert list(by_id) == ["mn_p_live", "mn_d_twin", "mn_a_weak", "mn_a_ok", "mn_a_now", "mn_s"]
    assert by_id["mn_d_twin"].uses == 6
    assert by_id["mn_d_twin"].weight == pytest.approx(0.30 * math.exp(-1.8))
    assert by_id["mn_a_weak"].state == MnestState.DECAYING
    assert by_id["mn_a_ok"].ts_weight == NOW
    assert by_id["mn_a_now"] == rules.AgerRow.of(rows[6])
    assert by_id["mn_s"] == rules.AgerRow.of(rows[7])


def test_age_twice_at_the_same_instant_changes_nothing_more() -> None:
    rows = [
        _row("mn_1", "active", 0.9),
        _row("mn_2", "active", 0.3, dst_version="2"),
        _row("mn_3", "proto", 0.9, dst_version=None),
    ]
    once, _ = rules.age(rows, NOW)
    twice, report = rules.age(once, NOW)
    assert twice == once
    assert report == rules.AgerReport(archive_candidates=1)


_state = st.sampled_from(list(MnestState))
_days = st.floats(0, 200)


@given(
    specs=st.lists(st.tuples(_state, st.floats(0, 1), st.floats(0, 0.2), _days, _days), max_size=8),
    t1=_days,
    t2=_days,
)
def test_age_is_schedule_free(specs: list, t1: float, t2: float) -> None:
    """Once at t2, or at t1 then at t2: the same rows, states and effective weights."""
    rows = [
        _row(
            f"mn_{i}",
            state,
            w,
            dst_version=None if state == MnestState.PROTO else str(i),
            decay_lambda=lam,
            ts_weight=T0 + timedelta(days=tw),
            ts_last=T0 + timedelta(days=tl),
            ts_first=T0,
        )
        for i, (state, w, lam, tw, tl) in enumerate(specs)
    ]
    first, second = sorted((T0 + timedelta(days=t1), T0 + timedelta(days=t1 + t2)))
    once, _ = rules.age(rows, second)
    stepwise, _ = rules.age(rules.age(rows, first)[0], second)
    assert [(r.id, r.state) for r in stepwise] == [(r.id, r.state) for r in once]
    for a, b in zip(stepwise, once, strict=True):
        assert a.effective_weight(second) == pytest.approx(
            b.effective_weight(second), rel=1e-9, abs=1e-15
        )


def test_the_ager_counts_are_the_report_s_fields() -> None:
    """An ager statement adds its row count to AgerCount members: each names a field of
    AgerReport, and every field has one."""
    from dataclasses import fields

    assert [c.value for c in rules.AgerCount] == [f.name for f in fields(rules.AgerReport)]


def test_the_ager_s_batches_are_short_while_writers_are_about_and_longer_once_they_are_gone() -> (
    None
):
    """15 ms while a writer was seen within the last second, 75 ms after that."""
    assert rules.AGER_BATCH_TARGET_S == 0.015
    assert rules.AGER_BATCH_QUIET_TARGET_S == 0.075
    assert rules.AGER_WRITERS_SEEN_S == 1.0
    assert rules.ager_batch_target(0.0) == 0.015
    assert rules.ager_batch_target(0.999) == 0.015
    assert rules.ager_batch_target(1.0) == 0.075
    assert rules.ager_batch_target(3600.0) == 0.075


@pytest.mark.parametrize(
    ("took", "target", "last", "expected"),
    [
        (0.015, 0.015, 0.015, 800),  # on target: unchanged
        (0.0075, 0.015, 0.015, 1600),  # twice too fast: twice the rows
        (0.001, 0.015, 0.015, 1600),  # far too fast: still at most twice
        (0.0, 0.015, 0.015, 1600),  # too fast to time
        (0.03, 0.015, 0.015, 400),  # twice too slow: half the rows
        (0.3, 0.015, 0.015, 400),  # far too slow: still at least half
        (0.075, 0.015, 0.075, 160),  # writers came while batches were long: short at once
        (0.3, 0.015, 0.075, 80),  # ... and at most half of that
        (0.015, 0.075, 0.015, 4000),  # writers gone: 75 ms at once...
        (0.001, 0.075, 0.015, 8000),  # ... and at most twice that
    ],
)
def test_the_ager_s_next_batch_is_scaled_towards_its_target(
    took: float, target: float, last: float, expected: int
) -> None:
    assert rules.ager_next_step(800, took, target, last) == expected


def test_the_ager_s_next_batch_covers_at_least_one_position() -> None:
    assert rules.ager_next_step(1, 10.0, 0.015, 0.015) == 1


def test_the_ager_tries_a_batch_again_after_10_ms_doubling_up_to_1_s_without_end() -> None:
    pauses = [rules.ager_batch_retry_pause(a) for a in range(10)]
    assert pauses == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0, 1.0]
    assert rules.ager_batch_retry_pause(10**6) == 1.0  # a batch kept waiting a week
    assert rules.AGER_ROW_LOCK_TIMEOUT_S == 0.05
    assert not hasattr(rules, "AGER_BATCH_ATTEMPTS")


@pytest.mark.parametrize(
    ("lo", "hi", "end"),
    [(0, 40, 20), (10, 13, 11), (10, 12, 11), (10, 11, 11), (7, 8, 8)],
)
def test_a_batch_tried_again_covers_half_its_positions_and_at_least_one(
    lo: int, hi: int, end: int
) -> None:
    assert rules.ager_shrunk_end(lo, hi) == end


@given(st.integers(0, 10**9), st.integers(1, 10**6))
def test_a_batch_shrunk_again_and_again_reaches_one_position_and_stays_there(
    lo: int, width: int
) -> None:
    hi, tries = lo + width, 0
    while hi - lo > 1:
        shrunk = rules.ager_shrunk_end(lo, hi)
        assert lo < shrunk < hi
        hi, tries = shrunk, tries + 1
    assert rules.ager_shrunk_end(lo, hi) == lo + 1 and tries <= width.bit_length()


@pytest.mark.parametrize(
    ("width", "planned", "step"),
    [(1, 40, 2), (16, 40, 32), (32, 40, 40), (40, 40, 40), (3, 40, 6), (1, 1, 1), (7, 5, 5)],
)
def test_fixed_batches_grow_back_twice_at_a_time_to_their_planned_size(
    width: int, planned: int, step: int
) -> None:
    assert rules.ager_regrown_step(width, planned) == step


def test_a_postgresql_batch_waits_for_a_row_at_most_the_row_lock_timeout() -> None:
    from mnestoma.schema.sql.ager import postgresql_ager_statements

    timeout = str(postgresql_ager_statements(True).row_lock_timeout)
    assert timeout == "SET LOCAL lock_timeout = '50ms'"


def test_a_postgresql_batch_hands_the_pages_it_writes_out_to_the_disk_every_256_kib() -> None:
    from mnestoma.schema.sql.ager import postgresql_ager_statements

    assert rules.AGER_FLUSH_AFTER_KIB == 256
    flush = str(postgresql_ager_statements(True).write_behind)
    assert flush == "SET LOCAL backend_flush_after = '256kB'"


def test_writers_count_as_about_for_a_second_after_the_ager_last_saw_one() -> None:
    assert rules.AGER_WRITERS_SEEN_S == 1.0
    assert rules.ager_writers_about(0.0) and rules.ager_writers_about(0.999)
    assert not rules.ager_writers_about(1.0)
