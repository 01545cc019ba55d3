"""Every invariant of the contract, checked on a whole database after a test has run.

``check_invariants(url)`` reads the store with plain SQL (not through the package under test)
and fails with an ``AssertionError`` listing every broken rule. ``dump_tables(url)`` returns
every row of every table, ordered, so a test can prove a failed call changed nothing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import NullPool, create_engine, inspect, text
from sqlalchemy.engine import URL, Connection, Engine, make_url

__all__ = ["check_invariants", "dump_tables", "plain_engine", "wait_for_other_sessions_to_end"]

STATES = {"active", "proto", "decaying", "superseded"}
KINDS = {"created", "reinforced", "transition", "promoted", "merged", "pruned"}
COUNTED = {"created", "reinforced"}
ID_RE = re.compile(r"^mn_[A-Za-z0-9_-]{12,}$")
TABLES = {"mnests": "id", "events": "id", "canonical_query_log": "id", "ager_runs": "id"}
# The planner's chains (revision 0014 on), by their key.
CHAINS = "mnest_chains"
CHAIN_KEY = "prev_executor, src_executor, dst_executor"


def _plain_url(url: str | URL) -> URL:
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def plain_engine(url: str | URL) -> Engine:
    """An engine that talks to the store without any of the package's configuration. No
    connection outlives its ``with`` block (NullPool): a test that never disposes the
    engine leaves no session behind for the next test to wait for."""
    return create_engine(_plain_url(url), poolclass=NullPool)


@functools.lru_cache(maxsize=16)
def _server_reader(url: str) -> Engine:
    """A plain engine for the checks below, kept per server URL: a new engine's first
    connection asks the server about itself (about 5 ms), and a test calls them several
    times on one store. No connection outlives a check (NullPool), so no session is left."""
    return create_engine(_plain_url(url), poolclass=NullPool)


@contextlib.contextmanager
def _connected(url: str | URL) -> Iterator[Connection]:
    """A connection to the store at ``url`` for one check. A SQLite file gets an engine of
    its own each time (cheap; a relative path is found from the working folder of now)."""
    key = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    if make_url(key).get_backend_name() != "sqlite":
        with _server_reader(key).connect() as conn:
            yield conn
        return
    engine = plain_engine(key)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


# The other client sessions of the database the connection is in (not this one, not the
# server's own processes): counted by the waits below, ended by the reset of a worker's store.
_OTHER_SESSIONS_WHERE = (
    "FROM pg_stat_activity WHERE datname = current_database()"
    " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)
OTHER_SESSIONS = text("SELECT count(*) " + _OTHER_SESSIONS_WHERE)
END_OTHER_SESSIONS = text("SELECT pg_terminate_backend(pid) " + _OTHER_SESSIONS_WHERE)


def other_sessions_after(conn: Connection, timeout: float) -> int:
    """PostgreSQL: how many other client sessions of the database are left once they have
    all ended or ``timeout`` seconds have passed (a killed or finished client's server
    process ends after it has committed and reported its statistics). Each look takes a new
    snapshot of ``pg_stat_activity``, also inside a transaction."""
    end = time.monotonic() + timeout
    while (others := int(conn.execute(OTHER_SESSIONS).scalar_one())) and time.monotonic() < end:
        time.sleep(0.02)
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    return others


def wait_for_other_sessions_to_end(conn: Connection, timeout: float = 30.0) -> None:
    """PostgreSQL: wait until no other client session of the database is left
    (:func:`other_sessions_after`), else fail."""
    others = other_sessions_after(conn, timeout)
    if others:
        raise AssertionError(f"{others} other sessions still open after {timeout}s")


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def dump_tables(url: str | URL) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (and the Alembic revision), ordered by primary key."""
    with _connected(url) as conn:
        tables = dict(TABLES)
        if inspect(conn).has_table(CHAINS):
            tables[CHAINS] = CHAIN_KEY
        out = {
            table: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY {key}"))]
            for table, key in tables.items()
        }
        out["mnestoma_alembic_version"] = [
            tuple(r) for r in conn.execute(text("SELECT version_num FROM mnestoma_alembic_version"))
        ]
        return out


def _name_ok(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and len(value) <= 255


def check_invariants(url: str | URL) -> None:
    """Assert every invariant of the contract on the database at ``url``."""
    problems: list[str] = []
    with _connected(url) as conn:
        if conn.dialect.name == "sqlite":
            integrity = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check")]
            if integrity != ["ok"]:
                problems.append(f"PRAGMA integrity_check: {integrity[:5]}")
            fk = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
            if fk:
                problems.append(f"PRAGMA foreign_key_check: {fk[:5]}")
        mnests = conn.execute(text("SELECT * FROM mnests ORDER BY id")).mappings().all()
        events = conn.execute(text("SELECT * FROM events ORDER BY id")).mappings().all()
        queries = conn.execute(text("SELECT * FROM canonical_query_log")).mappings().all()
        view_ids = sorted(r[0] for r in conn.execute(text("SELECT id FROM v_mnestoma")))
        chains = (
            conn.execute(text(f"SELECT * FROM {CHAINS} ORDER BY {CHAIN_KEY}")).mappings().all()
            if inspect(conn).has_table(CHAINS)
            else []
        )

    rows = {r["id"]: r for r in mnests}
    _check_rows(mnests, problems)
    _check_keys(mnests, problems)
    _check_events(rows, events, problems)
    _check_chains(chains, problems)
    expected_view = sorted(i for i, r in rows.items() if r["state"] in ("active", "proto"))
    if view_ids != expected_view:
        problems.append("v_mnestoma does not hold exactly the active and proto rows")
    for q in queries:
        digest = hashlib.sha256(q["canonical_query"].encode("utf-8")).hexdigest()
        if q["canonical_hash"] != digest:
            problems.append(f"canonical_query_log {q['id']}: hash is not sha256 of the query")
        if q["ts"] is None:
            problems.append(f"canonical_query_log {q['id']}: no ts")
    assert not problems, "invariants broken:\n  " + "\n  ".join(problems[:40])


def _check_rows(mnests: Any, problems: list[str]) -> None:
    for r in mnests:
        rid = r["id"]
        if not isinstance(rid, str) or not ID_RE.match(rid):
            problems.append(f"{rid!r}: id is not mn_ + at least 12 url-safe characters")
        for col in ("src_executor", "src_version", "dst_executor"):
            if not _name_ok(r[col]):
                problems.append(f"{rid}: {col} empty or over 255 characters")
        if r["dst_version"] is not None and not _name_ok(r["dst_version"]):
            problems.append(f"{rid}: dst_version empty or over 255 characters")
        w = r["weight"]
        if w is None or not math.isfinite(w) or not 0.0 <= w <= 1.0:
            problems.append(f"{rid}: weight {w!r} outside [0, 1]")
        lam = r["decay_lambda"]
        if lam is None or not math.isfinite(lam) or lam < 0:
            problems.append(f"{rid}: decay_lambda {lam!r} negative")
        if r["uses"] is None or r["uses"] < 1:
            problems.append(f"{rid}: uses {r['uses']!r} < 1")
        ok, error = r.get("ok_count", 0), r.get("error_count", 0)
        if ok < 0 or error < 0 or (r["uses"] is not None and ok + error > r["uses"]):
            problems.append(f"{rid}: ok_count {ok} + error_count {error} outside [0, uses]")
        first, last, wts = _utc(r["ts_first"]), _utc(r["ts_last"]), _utc(r["ts_weight"])
        if first is None or last is None or wts is None:
            problems.append(f"{rid}: a timestamp is NULL")
        elif last < first:
            problems.append(f"{rid}: ts_last {last} before ts_first {first}")
        state = r["state"]
        if state not in STATES:
            problems.append(f"{rid}: unknown state {state!r}")
        if state == "proto" and r["dst_version"] is not None:
            problems.append(f"{rid}: a proto with a dst_version")
        if state in ("active", "decaying") and r["dst_version"] is None:
            problems.append(f"{rid}: {state} row without dst_version")
        if state in ("active", "decaying") and r["desired_sig"] is not None:
            problems.append(f"{rid}: {state} row keeps a desired_sig")


def _check_keys(mnests: Any, problems: list[str]) -> None:
    keys = Counter(
        (r["src_executor"], r["src_version"], r["dst_executor"], r["dst_version"], r["state"])
        for r in mnests
    )
    for key, n in keys.items():
        if n > 1:
            problems.append(f"key {key} held by {n} rows")
    protos = Counter(
        (r["src_executor"], r["src_version"], r["dst_executor"])
        for r in mnests
        if r["state"] == "proto"
    )
    for key, n in protos.items():
        if n > 1:
            problems.append(f"{n} protos for {key}")


def _check_events(rows: dict[str, Any], events: Any, problems: list[str]) -> None:
    """Each row's history against the row: one created event, uses = its passings plus those
    of the rows merged into it (ok_count and error_count alike, from the passings' outcomes),
    the state its last event ends in; nothing merged away stays.

    A ``merged`` event is written on both rows of a merge: the absorbing row's keeps its state
    (state_before = state_after), the absorbed row's does not (the ager's demotion merge:
    active to decaying; a copy's: no state before, the row was not in the store). A copy moves
    the absorbed row's history to the absorbing row, but for the passings of turns the
    absorbing row already counted, which stay behind and count once.
    """
    counted: Counter[str] = Counter()
    outcomes: Counter[tuple[str, str]] = Counter()  # (mnest id, outcome) of its passings
    turn_outcomes: defaultdict[str, dict[str, str | None]] = defaultdict(dict)
    created: Counter[str] = Counter()
    turns: defaultdict[str, set[str]] = defaultdict(set)
    gone: set[str] = set()
    copied_in: set[str] = set()  # rows absorbed by a copy (their history moved)
    merged_in: dict[str, list[str]] = defaultdict(list)
    turn_edges: Counter[tuple[str, str]] = Counter()
    last_state: dict[str, str | None] = {}
    for e in events:
        eid, mid, kind = e["id"], e["mnest_id"], e["kind"]
        if kind not in KINDS:
            problems.append(f"event {eid}: unknown kind {kind!r}")
        if mid is None or e["ts"] is None:
            problems.append(f"event {eid}: no mnest_id or no ts")
        for col in ("weight_before", "weight_after"):
            w = e[col]
            if w is not None and (not math.isfinite(w) or not -1e-12 <= w <= 1.0 + 1e-12):
                problems.append(f"event {eid}: {col} {w!r} outside [0, 1]")
        for col in ("state_before", "state_after"):
            if e[col] is not None and e[col] not in STATES:
                problems.append(f"event {eid}: {col} {e[col]!r} unknown")
        if kind in COUNTED:
            counted[mid] += 1
            outcome = e.get("outcome")
            if outcome is not None:
                outcomes[(mid, outcome)] += 1
            if e["turn_id"] is not None:
                turn_outcomes[mid][e["turn_id"]] = outcome
                turn_edges[(e["turn_id"], mid)] += 1
                turns[mid].add(e["turn_id"])
        if kind == "created":
            created[mid] += 1
        if kind == "pruned":
            gone.add(mid)
        if kind == "merged":
            if e["state_after"] is None or e["related_id"] is None:
                problems.append(
                    f"event {eid}: a merge without the surviving state or the other row"
                )
            elif e["state_before"] == e["state_after"]:
                merged_in[mid].append(e["related_id"])
            else:
                gone.add(mid)
                if e["state_before"] is None:
                    copied_in.add(mid)
        if kind != "pruned":
            last_state[mid] = e["state_after"]

    for (turn, mid), n in turn_edges.items():
        if n > 1:
            problems.append(f"turn {turn!r} counted {n} times on {mid}")
    for mid in counted:
        if mid not in rows and mid not in gone:
            problems.append(f"{mid}: has passings but is gone without a pruned/merged event")
    for mid in gone:
        if mid in rows:
            problems.append(f"{mid}: pruned or merged away, yet still present")

    memo: dict[tuple[str, str | None], int] = {}
    open_: set[str] = set()  # rows whose uses are being summed: met again, a merge cycle

    def expected_uses(mid: str, outcome: str | None = None) -> int:
        """The passings counted on ``mid`` (with ``outcome`` when given: ok_count or
        error_count) and on the rows merged into it."""
        if (mid, outcome) in memo:
            return memo[(mid, outcome)]
        if mid in open_:
            problems.append(f"merge cycle through {mid}")
            return 0
        open_.add(mid)
        total = counted[mid] if outcome is None else outcomes[(mid, outcome)]
        for absorbed in merged_in[mid]:
            total += expected_uses(absorbed, outcome)
            if absorbed in copied_in:  # a turn both rows counted counts once, as mid's
                shared = turns[absorbed] & turns[mid]
                total -= sum(1 for t in shared if outcome in (None, turn_outcomes[absorbed].get(t)))
        open_.discard(mid)
        memo[(mid, outcome)] = total
        return total

    for mid in copied_in:
        if created[mid] > 1:
            problems.append(f"{mid}: {created[mid]} created events left behind by a copy")
    for mid, r in rows.items():
        # a copy moved each absorbed row's created event here, unless its turn stayed behind
        brought = sum(1 - created[a] for a in merged_in[mid] if a in copied_in)
        if created[mid] != 1 + brought:
            problems.append(f"{mid}: {created[mid]} created events (expected {1 + brought})")
        want = expected_uses(mid)
        if r["uses"] != want:
            problems.append(
                f"{mid}: uses {r['uses']} but {counted[mid]} created/reinforced events"
                f" + merged-in uses = {want}"
            )
        for outcome, column in (("ok", "ok_count"), ("error", "error_count")):
            if column in r and r[column] != expected_uses(mid, outcome):
                problems.append(
                    f"{mid}: {column} {r[column]} but its passings and merged-in rows"
                    f" say {expected_uses(mid, outcome)}"
                )
        if last_state.get(mid) != r["state"]:
            problems.append(
                f"{mid}: state {r['state']!r} but its last event ends in {last_state.get(mid)!r}"
            )


def _check_chains(chains: Any, problems: list[str]) -> None:
    """Each chain of the planner: names, at least one passing, its decayed count finite, not
    negative and never above its raw count (each passing counts 1 at most, decayed), its
    first passing not after its last."""
    for r in chains:
        key = (r["prev_executor"], r["src_executor"], r["dst_executor"])
        if not all(_name_ok(name) for name in key):
            problems.append(f"chain {key}: a name empty or over 255 characters")
        uses, count = r["uses"], r["decayed_uses"]
        if uses is None or uses < 1:
            problems.append(f"chain {key}: uses {uses!r} < 1")
        if count is None or not math.isfinite(count) or count < 0:
            problems.append(f"chain {key}: decayed_uses {count!r} not a count")
        elif uses is not None and count > uses * (1 + 1e-9):
            problems.append(f"chain {key}: decayed_uses {count!r} above its {uses} uses")
        first, last = _utc(r["ts_first"]), _utc(r["ts_last"])
        if first is None or last is None:
            problems.append(f"chain {key}: a timestamp is NULL")
        elif last < first:
            problems.append(f"chain {key}: ts_last {last} before ts_first {first}")
