"""A hand-written baseline of the contract's hot operations on plain ``sqlite3``.

Same schema as the package (the database is created by ``mnestoma.upgrade``), same rules
and the same events; WAL, ``synchronous=NORMAL``, ``BEGIN IMMEDIATE`` for writes and
statements kept in ``sqlite3``'s statement cache (constant SQL text, bound parameters).
Timestamps are stored as the package stores them on SQLite: naive UTC text
``YYYY-MM-DD HH:MM:SS.ffffff``. Rows come back as plain tuples in :data:`COLUMNS` order.
"""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

# The rules' numbers are the package's own (a change to a rule is a change to its rules
# module, which the baseline follows); everything else here is plain sqlite3.
from mnestoma.core.rules import (
    ARCHIVE_AFTER_DAYS,
    ARCHIVE_BELOW,
    DECAYING_BELOW,
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    PROTO_PRUNE_BELOW,
    REINFORCEMENT,
    SECONDS_PER_DAY,
)

__all__ = ["COLUMNS", "Baseline", "format_ts", "parse_ts", "reinforce"]

COLUMNS = (
    "id",
    "src_executor",
    "src_version",
    "dst_executor",
    "dst_version",
    "weight",
    "uses",
    "ts_first",
    "ts_last",
    "ts_weight",
    "decay_lambda",
    "state",
    "tags",
    "desired_sig",
)
_COLS = ", ".join(COLUMNS)
_EVENT_COLS = (
    "mnest_id, kind, ts, turn_id, weight_before, weight_after, state_before, state_after,"
    " reason, related_id"
)


Row = tuple[Any, ...]
# Passing's optional fields: dst_version, dst_exists, tags, desired_sig.
_PASSING_DEFAULTS: tuple[Any, ...] = (None, True, None, None)
Clock = Callable[[], datetime]


def format_ts(value: datetime) -> str:
    """An aware datetime as the package stores it on SQLite: naive UTC text."""
    v = value.astimezone(UTC)
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d} "
        f"{v.hour:02d}:{v.minute:02d}:{v.second:02d}.{v.microsecond:06d}"
    )


def parse_ts(text: str) -> datetime:
    """Stored SQLite text back to a naive UTC datetime."""
    return datetime.fromisoformat(text)


def reinforce(weight: float, decay_lambda: float, seconds: float) -> tuple[float, float]:
    """A weight decayed over ``seconds`` since its anchor (never negative), and that weight
    plus the reinforcement, clamped to [0, 1]: the event's before and after."""
    before = weight * math.exp(-decay_lambda * max(0.0, seconds / SECONDS_PER_DAY))
    return before, min(1.0, max(0.0, before + REINFORCEMENT))


def _eff(alias: str = "") -> str:
    """The decay formula in SQL for the row ``alias`` (the same formula as the package)."""
    p = f"{alias}." if alias else ""
    return (
        f"({p}weight * exp(-{p}decay_lambda * max(0.0, julianday(:now) - julianday({p}ts_weight))))"
    )


_SEL_ACTIVE = (
    f"SELECT {_COLS} FROM mnests WHERE src_executor = ? AND src_version = ?"
    " AND dst_executor = ? AND dst_version = ? AND state = 'active'"
)
_SEL_PROTO = (
    f"SELECT {_COLS} FROM mnests WHERE src_executor = ? AND src_version = ?"
    " AND dst_executor = ? AND dst_version IS NULL AND state = 'proto'"
)
_SEL_TURN_DONE = (
    "SELECT 1 FROM events WHERE turn_id = ? AND mnest_id = ? AND kind IN ('created', 'reinforced')"
)
_UPD_REINFORCE = (
    "UPDATE mnests SET weight = ?, uses = uses + 1, ts_last = ?, ts_weight = ?,"
    " tags = coalesce(?, tags), desired_sig = coalesce(?, desired_sig) WHERE id = ?"
)
_INS_MNEST = f"INSERT INTO mnests ({_COLS}) VALUES ({', '.join('?' * len(COLUMNS))})"
_INS_EVENT = f"INSERT INTO events ({_EVENT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

# --- the ager ---------------------------------------------------------------------------
# The best plain-sqlite3 ager found for the contract's whole work (events with their states,
# merges that never fail, the archive count, the run's ager_runs row): full scans in table
# order (``+state`` keeps SQLite off the state index, which would visit rows in random
# order), each weight computed once where a statement needs it several times, merges
# through a temporary table of rowid pairs, demotions and decays in separate statements (a
# statement that sets ``state`` rewrites that column's index entries for every row it
# touches), and a 64 MiB page cache for the run.
THRESHOLD_TOLERANCE = 1e-9
_DEMOTE_CUT = DECAYING_BELOW - THRESHOLD_TOLERANCE
_PRUNE_CUT = PROTO_PRUNE_BELOW - THRESHOLD_TOLERANCE
_ARCHIVE_CUT = ARCHIVE_BELOW - THRESHOLD_TOLERANCE
AGER_CACHE_KIB = 64 * 1024
_EV9 = (
    "mnest_id, kind, ts, weight_before, weight_after, state_before, state_after, related_id,"
    " recorder"
)
_AGER_PAIRS = (
    "CREATE TEMP TABLE bench_ager_pairs (d_rowid INTEGER PRIMARY KEY, a_rowid INTEGER NOT NULL,"
    " a_id TEXT NOT NULL, d_id TEXT NOT NULL, a_eff REAL NOT NULL, d_eff REAL NOT NULL,"
    " a_uses INTEGER NOT NULL, a_first TEXT NOT NULL, a_last TEXT NOT NULL)"
)
_AGER = {
    # actives below 0.20 with a decaying twin: from the decaying rows, the twin by the key
    "pairs": "INSERT INTO bench_ager_pairs SELECT d.rowid, a.rowid, a.id, d.id,"
    f" {_eff('a')}, {_eff('d')}, a.uses, a.ts_first, a.ts_last"
    " FROM mnests AS d JOIN mnests AS a ON a.src_executor = d.src_executor"
    " AND a.src_version = d.src_version AND a.dst_executor = d.dst_executor"
    " AND a.dst_version = d.dst_version AND +a.state = 'active'"
    f" WHERE d.state = 'decaying' AND d.dst_version IS NOT NULL AND {_eff('a')} < {_DEMOTE_CUT}",
    "merge_events": f"INSERT INTO events ({_EV9})"
    " SELECT a_id, 'merged', :now, a_eff, max(a_eff, d_eff), 'active', 'decaying', d_id, 'ager'"
    " FROM bench_ager_pairs UNION ALL"
    " SELECT d_id, 'merged', :now, d_eff, max(a_eff, d_eff), 'decaying', 'decaying', a_id,"
    " 'ager' FROM bench_ager_pairs",
    "merge_update": "UPDATE mnests SET (uses, ts_first, ts_last, weight, ts_weight) ="
    " (SELECT mnests.uses + p.a_uses, min(mnests.ts_first, p.a_first),"
    " max(mnests.ts_last, p.a_last), max(p.a_eff, p.d_eff), max(mnests.ts_weight, :now)"
    " FROM bench_ager_pairs AS p WHERE p.d_rowid = mnests.rowid)"
    " WHERE rowid IN (SELECT d_rowid FROM bench_ager_pairs)",
    "merge_delete": "DELETE FROM mnests WHERE rowid IN (SELECT a_rowid FROM bench_ager_pairs)",
    # one scan: the events of the protos pruned and of the actives demoted
    "moves_events": f"INSERT INTO events ({_EV9})"
    " SELECT id, CASE state WHEN 'proto' THEN 'pruned' ELSE 'transition' END, :now, e,"
    " CASE state WHEN 'proto' THEN NULL ELSE e END, state,"
    " CASE state WHEN 'proto' THEN NULL ELSE 'decaying' END, NULL, 'ager'"
    f" FROM (SELECT id, state, {_eff()} AS e FROM mnests"
    " WHERE +state IN ('active', 'proto') LIMIT -1)"
    f" WHERE e < CASE state WHEN 'proto' THEN {_PRUNE_CUT} ELSE {_DEMOTE_CUT} END",
    "prune": f"DELETE FROM mnests WHERE +state = 'proto' AND {_eff()} < {_PRUNE_CUT}",
    "demote": f"UPDATE mnests SET state = 'decaying', weight = {_eff()},"
    f" ts_weight = max(ts_weight, :now) WHERE +state = 'active' AND {_eff()} < {_DEMOTE_CUT}",
    "decay": f"UPDATE mnests SET weight = {_eff()}, ts_weight = :now"
    " WHERE +state IN ('active', 'proto') AND ts_weight < :now",
    "archive_count": "SELECT count(*) FROM mnests WHERE +state = 'decaying'"
    f" AND ts_last <= :cutoff AND {_eff()} < {_ARCHIVE_CUT}",
    "drop_pairs": "DROP TABLE temp.bench_ager_pairs",
    "run": "INSERT INTO ager_runs (ts, duration_s, decayed, to_decaying, merged, protos_pruned,"
    " archive_candidates) VALUES (:now, :duration_s, :decayed, :to_decaying, :merged,"
    " :protos_pruned, :archive_candidates)",
}

_SEP = "char(1)"
_WALK = f"""
WITH RECURSIVE paths(last_id, dst_executor, dst_version, depth, score, path, seen) AS (
  SELECT id, dst_executor, dst_version, 1, {_eff()}, id,
         {_SEP} || src_executor || {_SEP} || dst_executor || {_SEP}
  FROM mnests
  WHERE state = 'active' AND src_executor = :src AND dst_executor <> src_executor
    AND {_eff()} >= :min_weight
  UNION ALL
  SELECT n.id, n.dst_executor, n.dst_version, p.depth + 1, p.score * {_eff("n")},
         p.path || ',' || n.id, p.seen || n.dst_executor || {_SEP}
  FROM paths p JOIN mnests n
    ON n.state = 'active' AND n.src_executor = p.dst_executor
   AND n.src_version = p.dst_version
  WHERE p.depth < :max_depth AND instr(p.seen, {_SEP} || n.dst_executor || {_SEP}) = 0
    AND {_eff("n")} >= :min_weight
)
SELECT path, score, depth FROM paths ORDER BY score DESC, depth, path
"""
_FETCH_IDS = (
    f"SELECT {', '.join('m.' + c for c in COLUMNS)} FROM json_each(?) j"
    " JOIN mnests m ON m.id = j.value"
)
_SUGGEST = (
    f"SELECT {_COLS}, {_eff()} AS effective FROM mnests"
    " WHERE state = 'active' AND src_executor = :src{version}"
    " ORDER BY effective DESC, uses DESC, id LIMIT :k"
)
_SUGGEST_ANY = _SUGGEST.format(version="")
_SUGGEST_VERSION = _SUGGEST.format(version=" AND src_version = :sv")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


class Baseline:
    """The contract's record_passing / record_turn / apply_ager / walk / suggest_next.

    No input validation beyond what the schema checks: this is the floor the package's
    overhead is measured against, not a second implementation to ship.
    """

    def __init__(self, path: str, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or _utc_now
        con = sqlite3.connect(
            path,
            isolation_level=None,
            check_same_thread=False,
            timeout=30.0,
            cached_statements=256,
        )
        con.execute("PRAGMA busy_timeout = 30000")
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = NORMAL")
        self._con = con
        # Set by the writers workload (benchmarks.lock_hold): marks each hold of the lock.
        self.holds: Any = None

    # --- plumbing ---------------------------------------------------------------------

    def _now(self) -> datetime:
        return self._clock().astimezone(UTC).replace(tzinfo=None)

    def _write(self, work: Callable[[], Any]) -> Any:
        con = self._con
        holds = self.holds
        con.execute("BEGIN IMMEDIATE")
        if holds is not None:
            holds.taken()
        try:
            result = work()
        except BaseException:
            con.execute("ROLLBACK")
            if holds is not None:
                holds.released()
            raise
        con.execute("COMMIT")
        if holds is not None:
            holds.released()
        return result

    # --- recording --------------------------------------------------------------------

    def record_passing(
        self,
        src_executor: str,
        src_version: str,
        dst_executor: str,
        dst_version: str | None = None,
        *,
        dst_exists: bool = True,
        turn_id: str | None = None,
        tags: Any = None,
        desired_sig: Any = None,
    ) -> Row:
        """Create (weight 0.30) or reinforce (+0.15 on the decayed weight) one edge."""
        key = (src_executor, src_version, dst_executor, dst_version if dst_exists else None)

        def work() -> Row:
            return self._record(key, dst_exists, turn_id, _json(tags), _json(desired_sig))

        return self._write(work)

    def _record(
        self,
        key: tuple[str, str, str, str | None],
        dst_exists: bool,
        turn_id: str | None,
        tags: str | None,
        sig: str | None,
    ) -> Row:
        con = self._con
        if dst_exists:
            row = con.execute(_SEL_ACTIVE, key).fetchone()
        else:
            row = con.execute(_SEL_PROTO, key[:3]).fetchone()
        now = self._now()
        if row is None:
            values, event = self._creation(key, dst_exists, turn_id, tags, sig, now)
            con.execute(_INS_MNEST, values)
            con.execute(_INS_EVENT, event)
            return values
        if turn_id is not None and con.execute(_SEL_TURN_DONE, (turn_id, row[0])).fetchone():
            return row
        new_row, update, event = self._reinforcement(row, turn_id, tags, sig, now)
        con.execute(_UPD_REINFORCE, update)
        con.execute(_INS_EVENT, event)
        return new_row

    @staticmethod
    def _creation(
        key: tuple[str, str, str, str | None],
        dst_exists: bool,
        turn_id: str | None,
        tags: str | None,
        sig: str | None,
        now: datetime,
    ) -> tuple[Row, Row]:
        mid = "mn_" + secrets.token_urlsafe(12)
        ts = format_ts(now.replace(tzinfo=UTC))
        state = "active" if dst_exists else "proto"
        values = (
            mid,
            *key,
            INITIAL_WEIGHT,
            1,
            ts,
            ts,
            ts,
            DEFAULT_DECAY_LAMBDA,
            state,
            tags,
            sig,
        )
        event = (mid, "created", ts, turn_id, None, INITIAL_WEIGHT, None, state, None, None)
        return values, event

    @staticmethod
    def _reinforcement(
        row: Row, turn_id: str | None, tags: str | None, sig: str | None, now: datetime
    ) -> tuple[Row, Row, Row]:
        mid, weight, uses, lam, state = row[0], row[5], row[6], row[10], row[11]
        old_weight_ts = parse_ts(row[9])
        ts_last = max(parse_ts(row[8]), now)
        ts_weight = max(old_weight_ts, now)
        before, after = reinforce(weight, lam, (ts_weight - old_weight_ts).total_seconds())
        t_last = format_ts(ts_last.replace(tzinfo=UTC))
        t_weight = format_ts(ts_weight.replace(tzinfo=UTC))
        new_tags = tags if tags is not None else row[12]
        new_sig = sig if sig is not None else row[13]
        new_row = (
            *row[:5],
            after,
            uses + 1,
            row[7],
            t_last,
            t_weight,
            lam,
            state,
            new_tags,
            new_sig,
        )
        update = (after, t_last, t_weight, tags, sig, mid)
        event = (mid, "reinforced", t_last, turn_id, before, after, state, state, None, None)
        return new_row, update, event

    def record_turn(self, turn_id: str, passings: Iterable[Sequence[Any]]) -> list[Row]:
        """Every passing of a turn in one transaction; each edge counts once per turn."""
        items = []
        for p in passings:
            t = tuple(p)
            s, sv, d, dv, exists_, tags, sig = t + _PASSING_DEFAULTS[len(t) - 3 :]
            items.append(((s, sv, d, dv if exists_ else None), bool(exists_), tags, sig))

        def work() -> list[Row]:
            con = self._con
            unique: dict[tuple[bool, Any], tuple[Any, ...]] = {}
            for key, exists_, tags, sig in items:
                unique[(exists_, key)] = (key, exists_, _json(tags), _json(sig))
            now = self._now()
            done: dict[tuple[bool, Any], Row] = {}
            updates, inserts, events = [], [], []
            for ident, (key, exists_, tags, sig) in unique.items():
                if exists_:
                    row = con.execute(_SEL_ACTIVE, key).fetchone()
                else:
                    row = con.execute(_SEL_PROTO, key[:3]).fetchone()
                if row is None:
                    values, event = self._creation(key, exists_, turn_id, tags, sig, now)
                    inserts.append(values)
                    events.append(event)
                    done[ident] = values
                elif con.execute(_SEL_TURN_DONE, (turn_id, row[0])).fetchone():
                    done[ident] = row
                else:
                    new_row, update, event = self._reinforcement(row, turn_id, tags, sig, now)
                    updates.append(update)
                    events.append(event)
                    done[ident] = new_row
            if updates:
                con.executemany(_UPD_REINFORCE, updates)
            if inserts:
                con.executemany(_INS_MNEST, inserts)
            if events:
                con.executemany(_INS_EVENT, events)
            return [done[(exists_, key)] for key, exists_, _t, _s in items]

        return self._write(work)

    # --- ageing -----------------------------------------------------------------------

    def apply_ager(self) -> dict[str, int]:
        """The contract's ager in set-based SQL; returns the AgerReport's fields."""
        started = time.perf_counter()
        now = self._clock().astimezone(UTC)
        p = {
            "now": format_ts(now),
            "cutoff": format_ts(now - timedelta(days=ARCHIVE_AFTER_DAYS)),
        }
        s = _AGER
        con = self._con
        cache = con.execute("PRAGMA cache_size").fetchone()[0]
        con.execute(f"PRAGMA cache_size = {-AGER_CACHE_KIB}")

        def work() -> dict[str, int]:
            con.execute(_AGER_PAIRS)
            merged = 0
            if con.execute(s["pairs"], p).rowcount:
                con.execute(s["merge_events"], p)
                con.execute(s["merge_update"], p)
                merged = con.execute(s["merge_delete"]).rowcount
            con.execute(s["moves_events"], p)
            pruned = con.execute(s["prune"], p).rowcount
            demoted = con.execute(s["demote"], p).rowcount
            decayed = con.execute(s["decay"], p).rowcount
            archive = con.execute(s["archive_count"], p).fetchone()[0]
            con.execute(s["drop_pairs"])
            report = {
                "decayed": decayed,
                "to_decaying": demoted + merged,
                "merged": merged,
                "protos_pruned": pruned,
                "archive_candidates": int(archive),
            }
            run = {**report, "now": p["now"], "duration_s": time.perf_counter() - started}
            con.execute(s["run"], run)
            return report

        try:
            return self._write(work)
        finally:
            con.execute(f"PRAGMA cache_size = {int(cache)}")

    # --- reading ----------------------------------------------------------------------

    def walk(
        self, src_executor: str, *, max_depth: int = 3, min_weight: float = 0.0
    ) -> list[list[Row]]:
        """Every simple path of 1..max_depth active edges, best score first (one CTE)."""
        con = self._con
        params = {
            "src": src_executor,
            "max_depth": max_depth,
            "min_weight": min_weight,
            "now": format_ts(self._clock()),
        }
        con.execute("BEGIN")
        try:
            paths = [r[0].split(",") for r in con.execute(_WALK, params)]
            ids = list(dict.fromkeys(i for path in paths for i in path))
            by_id = {r[0]: r for r in con.execute(_FETCH_IDS, (json.dumps(ids),))}
        finally:
            con.execute("COMMIT")
        return [[by_id[i] for i in path] for path in paths]

    def suggest_next(
        self, src_executor: str, src_version: str | None = None, *, k: int = 5
    ) -> list[tuple[Row, float]]:
        """The k strongest active edges out of the source, with their effective weights."""
        params: dict[str, Any] = {"src": src_executor, "k": k, "now": format_ts(self._clock())}
        sql = _SUGGEST_ANY
        if src_version is not None:
            params["sv"] = src_version
            sql = _SUGGEST_VERSION
        return [(r[:-1], r[-1]) for r in self._con.execute(sql, params)]

    def close(self) -> None:
        """Close the connection."""
        self._con.close()
