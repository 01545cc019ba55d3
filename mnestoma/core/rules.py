"""The contract's rules as pure functions and constants, shared by Python code and SQL."""

from __future__ import annotations

import math
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass, fields, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

__all__ = [
    "AGER_BATCH_GROWN_MAX_S",
    "AGER_BATCH_QUIET_TARGET_S",
    "AGER_BATCH_ROWS",
    "AGER_BATCH_TARGET_S",
    "AGER_FLUSH_AFTER_KIB",
    "AGER_LOCK_POLL_S",
    "AGER_RETRY_PAUSE_MAX_S",
    "AGER_RETRY_PAUSE_S",
    "AGER_ROW_LOCK_TIMEOUT_S",
    "AGER_STOP_POLL_S",
    "AGER_WAIT_WARN_S",
    "AGER_WAL_CHECKPOINT_MIB",
    "AGER_WRITERS_PATIENCE_S",
    "AGER_WRITERS_POLL_S",
    "AGER_WRITERS_SEEN_S",
    "AGER_YIELD_EVERY_S",
    "AGER_YIELD_MAX_S",
    "AGER_YIELD_POLL_S",
    "ARCHIVE_AFTER_DAYS",
    "ARCHIVE_BELOW",
    "BATCH_PAUSE_S",
    "DECAYING_BELOW",
    "DEFAULT_DECAY_LAMBDA",
    "EVENT_PRUNE_BATCH",
    "FORK_WAIT_S",
    "GRAPH_LARGE_BYTES",
    "INITIAL_WEIGHT",
    "LOCK_TIMEOUT_MAX_S",
    "MIN_EVIDENCE_CHARS",
    "PROTO_PRUNE_BELOW",
    "RECURRING_MIN_USES",
    "RECURRING_MIN_WEIGHT",
    "REINFORCEMENT",
    "REPLICA_CHECK_S",
    "REPLICA_CONNECT_TIMEOUT_S",
    "REPLICA_MAX_LAG_S",
    "REPLICA_READ_TIMEOUT_S",
    "REPLICA_SKIP_S",
    "REPLICA_STATUS_POLL_S",
    "REPLICA_STATUS_WAIT_S",
    "SECONDS_PER_DAY",
    "STATUS_ESTIMATE_FROM",
    "STATUS_RECENT_EVENTS",
    "STATUS_SAMPLED_IDS",
    "THRESHOLD_TOLERANCE",
    "TRIVIAL_NUMBER",
    "WRITE_LOCK_FIRST_PAUSE_S",
    "WRITE_LOCK_POLL_S",
    "WRITTEN_ROWS_KEPT",
    "AgerCount",
    "AgerReport",
    "EventKind",
    "MnestState",
    "Outcome",
    "Recorder",
    "ager_batch_grows",
    "ager_batch_retry_pause",
    "ager_batch_target",
    "ager_next_step",
    "ager_regrown_step",
    "ager_shrunk_end",
    "ager_wal_checkpoints",
    "ager_writers_about",
    "check_transition",
    "clamp_weight",
    "days_between",
    "decayed_weight",
    "event_batches",
    "is_below",
    "new_mnest_id",
    "new_store_id",
    "outcome_counts",
    "reinforce",
    "reinforced_weight",
    "replica_behind_since",
    "replica_check_interval",
    "replica_fresh_as_of",
    "success_rate",
    "threshold_cut",
]

INITIAL_WEIGHT = 0.30
REINFORCEMENT = 0.15
DEFAULT_DECAY_LAMBDA = 0.018
DECAYING_BELOW = 0.20
PROTO_PRUNE_BELOW = 0.05
ARCHIVE_BELOW = 0.05
ARCHIVE_AFTER_DAYS = 90
RECURRING_MIN_USES = 3
RECURRING_MIN_WEIGHT = 0.30
SECONDS_PER_DAY = 86400.0
# The longest a write may be told to wait for a lock (seconds; Settings.lock_timeout,
# MNESTOMA_LOCK_TIMEOUT, the mnestoma_lock_timeout execution option): one day. A wait without
# end (inf) or beyond what SQLite's busy timeout holds is a mistake, never a setting.
LOCK_TIMEOUT_MAX_S = SECONDS_PER_DAY
# prune_events: the event ids one batch covers, each batch its own short transaction. A
# range this wide is deleted in a few tens of milliseconds (SQLite and PostgreSQL, every
# event prunable), so a writer waits for one batch at most.
EVENT_PRUNE_BATCH = 5000
# PostgreSQL, events partitioned by month (contract §12): before a write takes its locks,
# in a short transaction of its own, the partitions of the current month and of this many
# months after it are made, again whenever the time comes within EVENT_PARTITION_MARGIN of
# the last month made; a write whose clock reached a month not made yet has them made
# right after its commit. Making one waits PARTITION_UPKEEP_LOCK_TIMEOUT_S at most for its
# instant's exclusive lock on events (writers queue behind it for as long), else is tried
# again PARTITION_UPKEEP_RETRY_S later (the default partition holds the rows meanwhile). A
# store whose events is not partitioned is looked at again after PARTITIONS_RECHECK_S.
EVENT_PARTITIONS_AHEAD = 3
EVENT_PARTITION_MARGIN = timedelta(days=7)
PARTITION_UPKEEP_LOCK_TIMEOUT_S = 0.05
PARTITION_UPKEEP_RETRY_S = 1.0
PARTITIONS_RECHECK_S = 60.0
# Making a month reads the default partition whole under that exclusive lock (PostgreSQL
# checks that none of its rows belongs to the month; those that do move into it): no month
# is made while it is larger than this (its size in the catalogue; about 30,000 events, read
# in a few milliseconds). Its rows then wait for split-history, which moves them online, and
# writers ask again after PARTITION_WAITING_RECHECK_S (revision 0016 holds it in bytes).
PARTITION_DEFAULT_MAX_MIB = 4
PARTITION_WAITING_RECHECK_S = 60.0
# prune_events on PostgreSQL takes every lock it needs of the partitions (the swap of the
# months it drops for the partition that keeps the live mnests' created events, the
# partitions held while their kept rows are copied, the drops, the deletes among the kept
# rows and in event_turn_edges) under this lock timeout (seconds), each try rolled back and
# tried again up to this many times, pausing this long more after each failed try, and
# RETENTION_LOCK_PAUSE_MAX_S at most: writers queue behind it for one try at most. The
# tries spent, the prune stops with a ConflictError, the store as that step found it.
RETENTION_LOCK_TIMEOUT_S = 0.05
RETENTION_LOCK_TRIES = 200
RETENTION_LOCK_PAUSE_S = 0.005
RETENTION_LOCK_PAUSE_MAX_S = 0.2
# PostgreSQL, events handed to pg_partman (contract §12): whether its part_config names events
# (then the package makes no month) is remembered per engine this long (seconds), and asked
# again only when the package would make a month.
PARTMAN_RECHECK_S = 60.0
# mnestoma split-history (PostgreSQL): the rows of a partition of the old layout are copied
# into the months that replace it SPLIT_BATCH_ROWS ids at a time, each batch its own
# transaction locking the rows it copies FOR SHARE (an insert is not held up), with
# a pause of SPLIT_PAUSE_S after each. A lock (the batch's, the triggers' made at the start,
# the swap's) is waited for SPLIT_LOCK_TIMEOUT_S at most and tried again up to SPLIT_TRIES
# times, pausing as retention does after each failed try.
SPLIT_BATCH_ROWS = 2000
SPLIT_PAUSE_S = 0.02
SPLIT_LOCK_TIMEOUT_S = 0.05
SPLIT_TRIES = 200

# Read replicas (contract §12). Lag is measured against the primary's WAL position: a
# facade reads the primary's position (pg_current_wal_lsn()) and a replica's replayed one
# (pg_last_wal_replay_lsn()) at most every replica_check_interval(replica_max_lag) seconds;
# a replica is fresh as of the last reading of the primary it has replayed, and serves a
# read only while that reading is at most replica_max_lag (REPLICA_MAX_LAG_S) seconds old.
# A replica that has not replayed a reading older than the bound, or that fails, is
# skipped for REPLICA_SKIP_S seconds. Connecting to one gives up after
# REPLICA_CONNECT_TIMEOUT_S seconds (libpq's least: 2); a read on one (its connection's
# ping, its checks, the read itself) is cut after replica_read_timeout
# (REPLICA_READ_TIMEOUT_S) seconds, and a deadline passed opens no new connection: a
# frozen replica holds a read at most max(REPLICA_READ_TIMEOUT_S, REPLICA_CONNECT_TIMEOUT_S)
# seconds, then the primary serves it.
REPLICA_MAX_LAG_S = 5.0
REPLICA_SKIP_S = 30.0
REPLICA_CHECK_S = 1.0
REPLICA_CONNECT_TIMEOUT_S = 2
REPLICA_READ_TIMEOUT_S = 2.0
# The status measures a replica against the primary's WAL position, read just before: one
# behind it is looked at again every REPLICA_STATUS_POLL_S seconds, for REPLICA_STATUS_WAIT_S
# seconds at most; its lag is the time it took to reach that position (a replica a moment
# behind is not reported as far behind as the time since the last commit it replayed).
REPLICA_STATUS_WAIT_S = 1.0
REPLICA_STATUS_POLL_S = 0.05

# The status on PostgreSQL (contract §12): from this many events (by the catalogue's
# estimate) its counts of events are estimates, below it they are counted (three scans of
# 200k events take about 0.1 s); the recorders' shares and the latest passings come from
# the STATUS_RECENT_EVENTS newest events (by id) instead of every event.
STATUS_ESTIMATE_FROM = 200_000
STATUS_RECENT_EVENTS = 10_000
# SQLite has no catalogue of estimates: its status estimates the events from this many ids
# drawn at random between the lowest and the highest (each looked up in the primary key).
STATUS_SAMPLED_IDS = 4_000
# apply_ager: how long one batch holds its locks (seconds), each batch its own transaction,
# so that a writer behind the ager waits for one batch at most (SQLite: the write lock;
# PostgreSQL: the batch's rows only). While writers are about (one waited for a batch, or
# was in a transaction on mnests, within AGER_WRITERS_SEEN_S), 15 ms: SQLite writers' p99
# then stays under 30 ms on a 2-core machine (25 ms left it at 70-1000 ms). While none is,
# 75 ms: nobody waits for the batches, and fewer commits cost less. The run sizes its
# batches to the target as it goes (from the time the last batch took), from AGER_BATCH_ROWS
# rows (small: the first batches read a cold cache), unless the caller fixes a number of
# rows per batch.
AGER_BATCH_TARGET_S = 0.015
AGER_BATCH_QUIET_TARGET_S = 0.075
AGER_WRITERS_SEEN_S = 1.0
AGER_BATCH_ROWS = 500
# apply_ager, sized by the run (no batch_rows), while no writer is about: a batch grows, step
# after step of AGER_BATCH_QUIET_TARGET_S, in one transaction, and commits only when a writer
# waits for it (SQLite: a write of this package waiting for the lock; PostgreSQL: a session
# holding a writer's lock on mnests), when the run's caller asks it to stop, or after
# AGER_BATCH_GROWN_MAX_S. A writer that comes waits for one step and the commit, as it would
# behind one quiet batch. The bound is for the writers that cannot say they wait (a
# service's own code writing the same SQLite file: it waits this long at most, well inside
# any busy timeout), for a stopped run (it stops within a step of being asked, but its
# caller sees the progress only at each commit), and for the work a PostgreSQL batch that
# gives up on a row lock throws away. A commit costs little once the checkpoints are out
# of the way (below): 1 s of work, tens of thousands of rows, makes the commits a few
# percent of a run.
AGER_BATCH_GROWN_MAX_S = 1.0
# apply_ager on SQLite: a run holds back the WAL's automatic checkpoints of its own
# connection while no writer is about (each checkpoint waits for the disk twice, and a run
# of small batches made one after nearly every batch), and lets its commit checkpoint as
# usual (PASSIVE, at the connection's own wal_autocheckpoint) when writers are about, when
# the WAL has reached this size (MiB; read from the WAL index) and at its last commit. The
# WAL so holds at most this much plus one batch's pages while the run goes on (the next
# write after a checkpoint starts it again from its beginning).
AGER_WAL_CHECKPOINT_MIB = 256
# SQLite, a write that finds the write lock taken (seconds): each try takes the lock or
# fails at once (no busy timeout), and the write sleeps between its tries,
# WRITE_LOCK_FIRST_PAUSE_S after the first, then WRITE_LOCK_POLL_S at most while it says
# that it waits, on the store's doorbell, which the ager and a prune ring from each batch's
# commit to the end of the pause after it (engines.doorbell); WRITE_LOCK_FIRST_PAUSE_S
# again while the bell is rung, where it cannot say so or has no doorbell, and for the
# batches of those runs. Few wake-ups: under eight writers on one
# edge, each waiter waking every millisecond or two (SQLite's busy handler) kept the
# holder from running.
WRITE_LOCK_FIRST_PAUSE_S = 0.001
WRITE_LOCK_POLL_S = 0.010
# SQLite: the rows a connection's own passings last wrote, kept by edge key while nothing
# else writes to the store, so that its next passing of that edge needs no lookup under the
# write lock (schema.runner.KeptRows); at most this many a connection (then none, and the
# next passings keep theirs again).
WRITTEN_ROWS_KEPT = 4096
# SQLite: a pause (seconds) in which writers waiting for the write lock take it: the ager
# now and then, or between every two batches when it cannot see waiting writers (see
# AGER_YIELD_EVERY_S); prune_events between every two batches (the SQLite backend's
# batch_pause_s), and then as long as writers say that they wait (AGER_YIELD_MAX_S at
# most). Small beside a batch, so that a run takes little longer than one transaction
# would; a write that cannot say it waits tries every WRITE_LOCK_FIRST_PAUSE_S.
BATCH_PAUSE_S = 0.003
# The ager on SQLite, between two batches: while writers of this package wait for the write
# lock (each says so while it waits, see engines.locking.WaitingWriters), it waits for them,
# looking again this often, up to AGER_YIELD_MAX_S; when none waits it goes on at once, but
# pauses BATCH_PAUSE_S at least every AGER_YIELD_EVERY_S, for writers that do not say so
# (a service's own code writing its own tables in the same file).
AGER_YIELD_POLL_S = 0.0005
AGER_YIELD_MAX_S = 0.05
AGER_YIELD_EVERY_S = 0.1
# SQLite, a process forking (os.fork, multiprocessing's "fork", gunicorn's workers) while a
# thread of it is inside a write: the fork waits this long at most (seconds) for the writes
# in progress to end, holding new ones back meanwhile, so that the child gets a store it can
# write to (see mnestoma.engines.locking). A few of the longest batches, well under a lock timeout.
FORK_WAIT_S = 5.0
# apply_ager on PostgreSQL: a batch locks the rows it changes, not the table, so writers of
# other rows never wait for it. Where a batch and a writer each hold a row the other wants,
# or writers queue on a row, the batch gives up after waiting this long for a row (seconds),
# rolls back (the writer goes on) and is tried again, on half its pages (ager_shrunk_end,
# down to one page), after ager_batch_retry_pause: AGER_RETRY_PAUSE_S, doubling up to
# AGER_RETRY_PAUSE_MAX_S. It is tried until it gets its rows: a run never fails because
# writers are busy (a limit of 50 attempts, about 7 s, failed runs on a loaded machine).
# After a success the batches grow back (ager_regrown_step, or by their timing). A run
# stopped while it waits (an async caller cancelled) looks every AGER_STOP_POLL_S; a batch
# that has waited AGER_WAIT_WARN_S in all says so in the log, as a run that did at its end.
AGER_ROW_LOCK_TIMEOUT_S = 0.05
AGER_RETRY_PAUSE_S = 0.01
AGER_RETRY_PAUSE_MAX_S = 1.0
AGER_STOP_POLL_S = 0.05
# How often a second run of the ager looks whether the first has ended (SQLite; PostgreSQL
# when its caller may stop it while it waits).
AGER_LOCK_POLL_S = 0.05
AGER_WAIT_WARN_S = 10.0
# apply_ager on PostgreSQL, between two batches: while another session is in a transaction on
# mnests (a writer mid-call), the run waits for it to end, looking again this often, up to
# AGER_WRITERS_PATIENCE_S: writers go first, and writers that fall behind (always one in)
# slow the run down to one batch per patience until they catch up.
AGER_WRITERS_PATIENCE_S = 0.05
AGER_WRITERS_POLL_S = 0.001
# apply_ager on PostgreSQL, while writers are about: a batch's server process asks the OS to
# write the pages it hands out of the server's buffers every this many KiB (its
# backend_flush_after; with none about it leaves them, as any client does), instead of
# leaving them dirty in the OS's page cache. Left there (PostgreSQL's default for a client's
# process), a run piled up to 350 MB of them, which the OS wrote out in bursts 30 s later;
# writers' worst stalls (up to 0.8 s, every commit queued on the WAL's fsync) came with them.
AGER_FLUSH_AFTER_KIB = 256
# The ager's thresholds (DECAYING_BELOW, PROTO_PRUNE_BELOW, ARCHIVE_BELOW) are crossed only by more
# than this: SQLite (julianday, milliseconds), PostgreSQL (epoch arithmetic) and Python compute an
# effective weight a few units in the 13th digit apart, so a weight that is exactly at a threshold
# must not fall on either side by rounding. 1e-9 is far above that noise and far below anything
# observable.
THRESHOLD_TOLERANCE = 1e-9
MAX_NAME_LENGTH = 255
MAX_JSON_DEPTH = 64  # containers nested in tags / desired_sig; deeper is InvalidInput
# The largest occurrence of an edge in a turn (contract §13): events.occurrence is a
# 32-bit INTEGER on both engines.
MAX_OCCURRENCE = 2**31 - 1
# What automatic recording (the in-process tracer, the OpenTelemetry processor) takes as
# evidence that one executor's output reached another: values too common to prove it never
# link two calls.
TRIVIAL_NUMBER = 1024  # numbers in [-1024, 1024]
MIN_EVIDENCE_CHARS = 4  # texts (and bytes) shorter than this
# `mnestoma graph` notes on stderr a picture larger than this (bytes): past it, viewers
# (Graphviz, Mermaid's renderers, a browser) take minutes or give up.
GRAPH_LARGE_BYTES = 10_000_000


class MnestState(StrEnum):
    """Lifecycle states of a mnest."""

    ACTIVE = "active"
    PROTO = "proto"
    DECAYING = "decaying"
    SUPERSEDED = "superseded"


class EventKind(StrEnum):
    """Kinds of event recorded in ``events``."""

    CREATED = "created"
    REINFORCED = "reinforced"
    TRANSITION = "transition"
    PROMOTED = "promoted"
    MERGED = "merged"
    PRUNED = "pruned"


class Recorder(StrEnum):
    """Who recorded an event (``events.recorder``)."""

    CALL = "call"  # a caller of the API
    TRACER = "tracer"  # the in-process tracer (mnestoma.tracing)
    OTEL = "otel"  # the OpenTelemetry span processor (mnestoma.otel)
    AGER = "ager"
    CLI = "cli"


class Outcome(StrEnum):
    """What followed a passing A→B (``events.outcome``): B returned, or B failed. A passing
    without one is unknown (NULL). Outcomes are counted beside ``uses`` and never change a
    weight: the rules of reinforcement and decay ignore them."""

    OK = "ok"
    ERROR = "error"


# What a passing of each outcome adds to ``(ok_count, error_count)``; an unknown one adds
# nothing (an Outcome member finds its plain value's entry: a StrEnum hashes as its value).
_OUTCOME_COUNTS: dict[str | None, tuple[int, int]] = {
    Outcome.OK.value: (1, 0),
    Outcome.ERROR.value: (0, 1),
}


def outcome_counts(outcome: str | None) -> tuple[int, int]:
    """What one passing adds to ``(ok_count, error_count)``."""
    return _OUTCOME_COUNTS.get(outcome, (0, 0))


def success_rate(ok: int, error: int) -> float:
    """``(ok + 1) / (ok + error + 2)``: the chance that a passing along an edge is followed
    by success, with one success and one failure assumed before any evidence (Laplace's
    rule), so that an edge never seen to fail is not certain and one never seen is 0.5."""
    return (ok + 1) / (ok + error + 2)


# The states the ager decays (and prunes or demotes), and that the view v_mnestoma shows.
LIVE_STATES: tuple[MnestState, ...] = (MnestState.ACTIVE, MnestState.PROTO)
LIVE = tuple(s.value for s in LIVE_STATES)  # the same, as the strings stored in mnests
# The states whose rows always carry a dst_version (a proto never does; a superseded row may).
VERSIONED_STATES: tuple[MnestState, ...] = (MnestState.ACTIVE, MnestState.DECAYING)

# Event kinds that stand for a passing (a created or reinforced edge).
PASSING_KINDS: tuple[EventKind, ...] = (EventKind.CREATED, EventKind.REINFORCED)
PASSING = tuple(k.value for k in PASSING_KINDS)  # the same, as the strings stored in events
# Recorders that mean the store is fed automatically by a runtime.
AUTOMATIC_RECORDERS: tuple[Recorder, ...] = (Recorder.TRACER, Recorder.OTEL)


def sql_literal(value: StrEnum) -> str:
    """``'a'``: one member's value as an SQL string literal (for CHECK and index texts)."""
    return f"'{value.value}'"


def sql_list(values: tuple[StrEnum, ...] | type[StrEnum]) -> str:
    """``'a', 'b'``: the values of an enum (or a tuple of members) as an SQL list."""
    return ", ".join(sql_literal(v) for v in values)


class AgerCount(StrEnum):
    """The counts of an :class:`AgerReport`, by field name: the ones a statement of the ager
    adds its row count to."""

    DECAYED = "decayed"
    TO_DECAYING = "to_decaying"
    MERGED = "merged"
    PROTOS_PRUNED = "protos_pruned"
    ARCHIVE_CANDIDATES = "archive_candidates"


@dataclass(frozen=True, slots=True)
class AgerReport:
    """What one run of the ager did (or, in a dry run, would do)."""

    decayed: int = 0
    to_decaying: int = 0
    merged: int = 0
    protos_pruned: int = 0
    archive_candidates: int = 0

    def __add__(self, other: AgerReport) -> AgerReport:
        """Two parts of one run counted together (a run's batches add up to its report)."""
        return AgerReport(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


def new_mnest_id() -> str:
    """A fresh mnest id: ``mn_`` followed by 16 url-safe random characters."""
    return "mn_" + secrets.token_urlsafe(12)


def new_store_id() -> str:
    """A fresh store identity (``mnestoma_store``): 32 random lowercase hex digits, as
    revision 0012 makes them in SQL."""
    return secrets.token_hex(16)


def clamp_weight(w: float) -> float:
    """Clamp a weight into [0, 1]."""
    return 0.0 if w < 0.0 else 1.0 if w > 1.0 else w


def event_batches(
    id_range: tuple[int, int] | None, size: int | None = None
) -> Iterator[tuple[int, int]]:
    """The id ranges ``[first, last]`` that cover ``id_range`` (the lowest and highest id of
    the events to prune; None: no event), ``size`` ids each (the batch size
    :data:`EVENT_PRUNE_BATCH` unless given), in id order."""
    if id_range is None:
        return
    step = max(1, EVENT_PRUNE_BATCH if size is None else size)
    low, high = id_range
    for first in range(low, high + 1, step):
        yield first, min(first + step - 1, high)


def replica_check_interval(max_lag: float) -> float:
    """Seconds a reading of the primary's WAL position, or of a replica's replayed one, is
    trusted: :data:`REPLICA_CHECK_S`, or a quarter of the lag bound when that is shorter (a
    replica that keeps up is then proven within the bound from one reading to the next)."""
    return min(REPLICA_CHECK_S, max_lag / 4)


def replica_fresh_as_of(readings: Sequence[tuple[float, int]], replayed: int) -> float | None:
    """When the primary was last seen at a WAL position that a replica has replayed: the time
    of the latest of ``readings`` ((time, position), oldest first) at or below ``replayed``,
    None when none is. The replica holds every commit made before that time."""
    for at, position in reversed(readings):
        if position <= replayed:
            return at
    return None


def replica_behind_since(readings: Sequence[tuple[float, int]], replayed: int) -> float | None:
    """Since when a replica is known to be behind: the time of the earliest of ``readings``
    past ``replayed`` (the primary had written then what the replica has not replayed yet),
    None when none is."""
    for at, position in readings:
        if position > replayed:
            return at
    return None


def ager_writers_about(since_writers_s: float) -> bool:
    """Whether the ager counts writers as about, ``since_writers_s`` seconds after it last
    saw one: within :data:`AGER_WRITERS_SEEN_S`."""
    return since_writers_s < AGER_WRITERS_SEEN_S


def ager_batch_grows(since_writers_s: float) -> bool:
    """Whether the ager's next batch (sized by the run) grows until a writer waits for it,
    ``since_writers_s`` seconds after it last saw a writer about: when none is about."""
    return not ager_writers_about(since_writers_s)


def ager_wal_checkpoints(wal_bytes: int, writers_about: bool) -> bool:
    """Whether a commit of the ager on SQLite checkpoints the WAL (holding ``wal_bytes``):
    while writers are about (as their commits would), or once the WAL holds
    :data:`AGER_WAL_CHECKPOINT_MIB`."""
    return writers_about or wal_bytes >= AGER_WAL_CHECKPOINT_MIB * 1024 * 1024


def ager_batch_target(since_writers_s: float) -> float:
    """How long the ager's next batch should hold its locks, ``since_writers_s`` seconds
    after it last saw a writer about: :data:`AGER_BATCH_TARGET_S` while writers are about
    (:func:`ager_writers_about`), else :data:`AGER_BATCH_QUIET_TARGET_S`."""
    if ager_writers_about(since_writers_s):
        return AGER_BATCH_TARGET_S
    return AGER_BATCH_QUIET_TARGET_S


def ager_batch_retry_pause(attempt: int) -> float:
    """Seconds the ager waits before trying again a batch whose attempt ``attempt`` (from 0)
    gave up waiting for a row lock (PostgreSQL): :data:`AGER_RETRY_PAUSE_S`, doubling, at
    most :data:`AGER_RETRY_PAUSE_MAX_S`, so that the writers it crossed commit first and a
    run kept waiting long costs them little."""
    return min(AGER_RETRY_PAUSE_MAX_S, AGER_RETRY_PAUSE_S * 2.0 ** min(attempt, 64))


def ager_shrunk_end(lo: int, hi: int) -> int:
    """The end of a batch ``[lo, hi)`` tried again after it gave up waiting for a row lock:
    half its positions, at least one, so that the rows before a held one get done."""
    return lo + max(1, (hi - lo) // 2)


def ager_regrown_step(width: int, planned: int) -> int:
    """The positions the next batch of a run of fixed batches covers after one of ``width``
    positions (fewer than ``planned`` when it had shrunk): twice as many, up to ``planned``."""
    return max(1, min(planned, 2 * width))


def ager_next_step(step: int, took_s: float, target_s: float, last_target_s: float) -> int:
    """The positions the next batch of the ager covers, given that ``step`` of them took
    ``took_s`` seconds against a target of ``last_target_s``: scaled towards ``target_s``,
    by half to twice once the change of target is allowed for (so that writers coming
    while batches are long find short ones at once)."""
    scale = target_s / took_s if took_s > 0 else 2.0 * target_s / last_target_s
    change = target_s / last_target_s
    return max(1, round(step * min(2.0 * change, max(0.5 * change, scale))))


def days_between(earlier: datetime, later: datetime) -> float:
    """Days from ``earlier`` to ``later``, never negative (a clock stepping back decays nothing)."""
    return max(0.0, (later - earlier).total_seconds() / SECONDS_PER_DAY)


def advance(old: datetime, now: datetime) -> datetime:
    """``max(old, now)``: a timestamp (ts_last, ts_weight) moved to ``now``, never backwards,
    so that a clock stepping back or a writer that read ``now`` earlier cannot reorder them."""
    return old if old > now else now


# Below these the decay is floored alike in Python and in SQL (PostgreSQL raises "value out of
# range: underflow" where Python returns 0.0 or a subnormal): an exponent is capped at
# MAX_EXPONENT, a weight under VANISHING decays to 0, and a decay speed under NEGLIGIBLE_RATE
# decays nothing. Nothing observable changes (every value they touch is below 1e-87), and the
# SQL twins (mnestoma.core.sqlrules) then give the same float as this module, bit for bit.
MAX_EXPONENT = 200.0
VANISHING = 1e-100
NEGLIGIBLE_RATE = 1e-150


def decayed_weight(weight: float, decay_lambda: float, since: datetime, now: datetime) -> float:
    """``weight × exp(−decay_lambda × days(now − since))``: the effective weight at ``now``
    (floored as :data:`MAX_EXPONENT` says)."""
    if decay_lambda < NEGLIGIBLE_RATE:
        return 0.0 if weight < VANISHING else weight
    return _decayed_by(weight, _decay_factor(decay_lambda, since, now))


def _decay_factor(decay_lambda: float, since: datetime, now: datetime) -> float:
    """``exp(−decay_lambda × days(now − since))``, its exponent capped at
    :data:`MAX_EXPONENT`: what a value decays by from ``since`` to ``now``."""
    return math.exp(-min(decay_lambda * days_between(since, now), MAX_EXPONENT))


def _decayed_by(value: float, factor: float) -> float:
    """``value × factor``, a value under :data:`VANISHING` decaying to 0."""
    return 0.0 if value < VANISHING else value * factor


def threshold_cut(threshold: float) -> float:
    """The value below which a weight counts as below ``threshold`` (see
    :data:`THRESHOLD_TOLERANCE`); the SQL of the ager compares with the same number."""
    return threshold - THRESHOLD_TOLERANCE


def is_below(effective: float, threshold: float) -> bool:
    """True when an effective weight is below one of the ager's thresholds: by more than
    :data:`THRESHOLD_TOLERANCE`, so that both engines and Python decide alike at the edge."""
    return effective < threshold_cut(threshold)


def reinforce(effective: float) -> float:
    """Weight after one more passing, from the effective weight now: + REINFORCEMENT, clamped
    to [0, 1]."""
    return clamp_weight(effective + REINFORCEMENT)


def reinforced_weight(weight: float, decay_lambda: float, since: datetime, now: datetime) -> float:
    """Weight after one more passing: the decayed weight plus REINFORCEMENT, clamped to [0, 1]."""
    return reinforce(decayed_weight(weight, decay_lambda, since, now))


# The advice of a refused proto transition; the command line words it as a command.
PROMOTE_HINT = "use promote_proto_to_active"

# Allowed (from, to) state changes for transition_state; the same state is a no-op.
_ALLOWED: frozenset[tuple[MnestState, MnestState]] = frozenset(
    {
        (MnestState.ACTIVE, MnestState.DECAYING),
        (MnestState.ACTIVE, MnestState.SUPERSEDED),
        (MnestState.DECAYING, MnestState.ACTIVE),
        (MnestState.DECAYING, MnestState.SUPERSEDED),
        (MnestState.SUPERSEDED, MnestState.ACTIVE),
        (MnestState.SUPERSEDED, MnestState.DECAYING),
        (MnestState.PROTO, MnestState.SUPERSEDED),
    }
)


def check_transition(current: MnestState, target: MnestState, *, has_version: bool) -> str | None:
    """Why ``current → target`` is refused, or None when it is allowed.

    A proto may only be superseded (promotion is ``promote_proto_to_active``); a versioned row
    can never become a proto; a superseded proto (no version) cannot become active or decaying.
    """
    if current == target:
        return None
    if target == MnestState.PROTO:
        return "a row cannot become a proto"
    if current == MnestState.PROTO:
        return (
            f"a proto cannot become {target.value}; {PROMOTE_HINT}"
            if target != MnestState.SUPERSEDED
            else None
        )
    if not has_version and target in (MnestState.ACTIVE, MnestState.DECAYING):
        return f"a row without dst_version cannot become {target.value}"
    if (current, target) not in _ALLOWED:
        return f"{current.value} cannot become {target.value}"
    return None


# =============================================================================================
# Ranking (contract §9): the order in which a planner should try what follows an executor.
# The primary key is the effective weight; its ties (frequent: REINFORCEMENT a use saturates at 1.0
# after six uses) are broken by the activation below, a pure function of uses, ts_first and
# ts_last. ``rank`` and ``suggest_next`` both sort with :func:`ranking_key`.
# =============================================================================================

# ACT-R's base-level decay d (Anderson & Lebiere 1998 use 0.5 throughout).
ACTIVATION_DECAY = 0.5
# Ages are in days and floored at one minute: a use "just now" is not infinitely recent.
ACTIVATION_MIN_AGE_DAYS = 1.0 / 1440.0

__all__ += ["MAX_EXPONENT", "NEGLIGIBLE_RATE", "VANISHING"]
__all__ += ["ACTIVATION_DECAY", "ACTIVATION_MIN_AGE_DAYS", "activation", "ranking_key"]


def activation(uses: int, ts_first: datetime, ts_last: datetime, now: datetime) -> float:
    """ACT-R base-level activation of an edge used ``uses`` times from ``ts_first`` to ``ts_last``.

    Petrov's (2006) hybrid approximation of ``ln Σ t_j^−d`` that keeps the latest use exact and
    spreads the other ``n − 1`` evenly over the edge's lifetime::

        B = ln( r^−d + (n − 1) · (L^(1−d) − r^(1−d)) / ((1 − d) · (L − r)) )

    with ``r`` = days since ``ts_last`` and ``L`` = days since ``ts_first`` (both floored at
    one minute, ``L ≥ r``), ``d`` = 0.5. One use: ``B = −d·ln r``; all uses at one instant:
    ``B = ln n − d·ln r``. It grows with every use and falls as ``ts_last`` recedes.
    """
    d = ACTIVATION_DECAY
    recent = max(ACTIVATION_MIN_AGE_DAYS, days_between(ts_last, now))
    life = max(recent, days_between(ts_first, now))
    latest = recent**-d
    if uses <= 1:
        return math.log(latest)
    # (L^(1−d) − r^(1−d)) / ((1−d)(L − r)) is the mean of t^−d over [r, L]; written with
    # expm1/log1p so that it stays exact as L → r, where it tends to r^−d.
    spread = life - recent
    if spread <= 0.0:
        mean_older = latest
    else:
        ratio = math.log1p(spread / recent)
        mean_older = recent**-d * recent * math.expm1((1.0 - d) * ratio) / ((1.0 - d) * spread)
    return math.log(latest + (uses - 1) * mean_older)


def ranking_key(effective_weight: float, activation_value: float) -> tuple[float, float]:
    """Sort key, best first: the higher effective weight, then the higher activation."""
    return (-effective_weight, -activation_value)


# =============================================================================================
# The decayed count of passings (contract §12, "Orders for a planner"): ``decayed_uses``, what
# ``rank(order_by="decayed_uses")`` and ``suggest_next(order_by="decayed_uses")`` order by.
# Each passing adds 1; the sum decays with the row's own ``decay_lambda`` (the weight's λ),
# and nothing clamps it, so an edge passed 500 times stays ahead of one passed 5 times where
# the weight (clamped at 1) saw them equal, while a new habit overtakes an old one as the old
# one's passings fade. It refers to the row's ``ts_last`` (the instant of its last passing),
# so that a passing updates it in place and reading it needs no scan of the events:
#     count(now) = decayed_uses × exp(−decay_lambda × days(now − ts_last))
# The weight, its clamp and its numbers (§4) do not depend on it.
# =============================================================================================

DECAYED_USES_ORDER = "decayed_uses"
# A backfilled count (revision 0010) treats a gap of λ·days between two passings this small
# as none: the closed form of spread_count loses its digits there, and ``uses`` is as good.
SPREAD_NEGLIGIBLE = 1e-9

__all__ += [
    "DECAYED_USES_ORDER",
    "counted_passing",
    "decayed_count",
    "merged_count",
    "passing_values",
    "spread_count",
]


def decayed_count(count: float, decay_lambda: float, ts_last: datetime, now: datetime) -> float:
    """A row's decayed count of passings at ``now``: ``count × exp(−λ × days(now − ts_last))``
    (the weight's decay, without its clamp)."""
    return decayed_weight(count, decay_lambda, ts_last, now)


def passing_values(
    weight: float,
    count: float,
    decay_lambda: float,
    ts_weight: datetime,
    ts_last: datetime,
    now: datetime,
) -> tuple[float, float, float]:
    """What one passing at ``now`` makes of a row: its effective weight before it
    (:func:`decayed_weight` from ``ts_weight``), its weight after it (:func:`reinforce`) and
    its decayed count after it (:func:`counted_passing` from ``ts_last``). The same floats as
    those functions, with one exponential where the two instants are the same (a row the
    ager has not decayed since its last passing)."""
    if ts_weight != ts_last or decay_lambda < NEGLIGIBLE_RATE:
        before = decayed_weight(weight, decay_lambda, ts_weight, now)
        return before, reinforce(before), counted_passing(count, decay_lambda, ts_last, now)
    factor = _decay_factor(decay_lambda, ts_last, now)
    before = _decayed_by(weight, factor)
    return before, reinforce(before), _decayed_by(count, factor) + 1.0


def counted_passing(count: float, decay_lambda: float, ts_last: datetime, now: datetime) -> float:
    """The decayed count after one more passing at ``now`` (the row's ``ts_last`` then moves to
    ``max(ts_last, now)``): the count decayed to that instant, plus one."""
    return decayed_count(count, decay_lambda, ts_last, now) + 1.0


def merged_count(
    a: tuple[float, float, datetime], b: tuple[float, float, datetime]
) -> tuple[float, datetime]:
    """Two rows of one edge merged (the ager's demotion merges, ``copy --append``): each
    ``(decayed_uses, decay_lambda, ts_last)`` decayed to the later ``ts_last`` and summed, as
    ``uses`` is summed; the merged row's ``ts_last`` is that later instant."""
    last = advance(a[2], b[2])
    return decayed_count(a[0], a[1], a[2], last) + decayed_count(b[0], b[1], b[2], last), last


def spread_count(uses: int, decay_lambda: float, ts_first: datetime, ts_last: datetime) -> float:
    """The decayed count of a row recorded before the count existed (revision 0010), from what
    the row itself holds: its ``uses`` passings spread evenly from ``ts_first`` to ``ts_last``,
    at ``ts_last``. With a gap ``x = λ·days(ts_last − ts_first)/(uses − 1)`` between two of
    them, ``Σ_{j<uses} e^{−jx} = (1 − e^{−x·uses}) / (1 − e^{−x})``; one use, or a gap of
    :data:`SPREAD_NEGLIGIBLE` or less: ``uses``. The revision computes the same in SQL
    (exponents capped at 200, as the SQL twins do)."""
    if uses <= 1:
        return float(uses)
    gap = min(decay_lambda * days_between(ts_first, ts_last) / (uses - 1), 200.0)
    if gap <= SPREAD_NEGLIGIBLE:
        return float(uses)
    return (1.0 - math.exp(-min(gap * uses, 200.0))) / (1.0 - math.exp(-gap))


# =============================================================================================
# The planner's probabilities (contract §13). The store keeps, for each pair of consecutive
# links of a recorded turn (A→B then B→C), a decayed count of passings of the chain
# (table ``mnest_chains``, by executor names), with the weight's default λ and the rules of
# the decayed count above. A planner asks with the last one or two executors of its turn and
# gets P(next | context): the edge's decayed counts, smoothed by Witten-Bell (a context's
# distinct successors, times CHAIN_SMOOTHING, stand for the passings to executors it has not
# seen yet), and the chain's interpolated with them. So no seen candidate is 0 or 1, and the
# candidates plus the unseen mass sum to 1.
# =============================================================================================

CHAIN_DECAY_LAMBDA = DEFAULT_DECAY_LAMBDA
# Witten-Bell's weight of the unseen: each distinct successor of a context (the chain's, the
# edge's) counts this many passings to something new. 1 is Witten-Bell's own (held-out
# calibration error 0.025 on the ScienceWorld benchmark, docs/graph.md).
CHAIN_SMOOTHING = 1.0
EDGE_SMOOTHING = 1.0
# The chain is the context used when its decayed count of passings is at least this: more than one
# passing's worth (two passings within the last 16 days, at DEFAULT_DECAY_LAMBDA); below it the
# single edge answers alone. A chain seen once outweighed an edge's long history on BFCL's traces
# (hit@1 0.593 with 0.5, 0.610 with 1.5; ScienceWorld's the same, docs/graph.md).
CHAIN_MIN_SUPPORT = 1.5
# A candidate never seen after the context gets the unseen mass shared as if among this many
# executors (rank's candidates without evidence, vet's unseen links).
UNSEEN_SUCCESSORS = 10
# The ager forgets a chain whose decayed count has faded below this (one passing, about 166
# days ago): PROTO_PRUNE_BELOW's number, for a count.
CHAIN_FORGET_BELOW = 0.05
PROBABILITY_ORDER = "p"

__all__ += [
    "CHAIN_DECAY_LAMBDA",
    "CHAIN_FORGET_BELOW",
    "CHAIN_MIN_SUPPORT",
    "CHAIN_SMOOTHING",
    "EDGE_SMOOTHING",
    "PROBABILITY_ORDER",
    "UNSEEN_SUCCESSORS",
    "ContextUsed",
    "NextProbabilities",
    "chain_increments",
    "next_probabilities",
    "probability_of",
    "unseen_probability",
]


class ContextUsed(StrEnum):
    """Which context a probability is conditioned on."""

    CHAIN = "chain"  # the last two executors: the chain's counts, interpolated with the edge's
    EDGE = "edge"  # the last executor alone
    NONE = "none"  # nothing known after the last executor: every candidate is unseen


@dataclass(frozen=True, slots=True)
class NextProbabilities:
    """P(next | context) of each executor seen after the context, the mass left to those never
    seen (``unseen``, > 0), the context used, and its decayed count of passings."""

    p: dict[str, float]
    unseen: float
    context: ContextUsed
    support: float


def _witten_bell(counts: Mapping[str, float], k: float) -> tuple[float, float]:
    """(total decayed count, its unseen weight) of one context's successors."""
    total = sum(counts.values())
    return total, k * sum(1 for c in counts.values() if c > 0)


def next_probabilities(
    edge: Mapping[str, float], chain: Mapping[str, float] | None = None
) -> NextProbabilities:
    """P(next | context) from decayed counts: ``edge`` of the last executor's successors,
    ``chain`` of the last two's (None: not asked).

    Edge: ``p(c) = n(c) / (N + k·T)``, unseen ``k·T / (N + k·T)`` (N the total, T the distinct
    successors, k :data:`EDGE_SMOOTHING`). Chain, when its total is at least
    :data:`CHAIN_MIN_SUPPORT`: ``p(c) = (n₂(c) + k₂·T₂·p_edge(c)) / (N₂ + k₂·T₂)``, unseen
    ``k₂·T₂·unseen_edge / (N₂ + k₂·T₂)`` (k₂ :data:`CHAIN_SMOOTHING`). Counts of 0 or less are
    left out.
    """
    n1, w1 = _witten_bell(edge, EDGE_SMOOTHING)
    if n1 > 0:
        p = {c: n / (n1 + w1) for c, n in edge.items() if n > 0}
        unseen, used, support = w1 / (n1 + w1), ContextUsed.EDGE, n1
    else:
        p, unseen, used, support = {}, 1.0, ContextUsed.NONE, 0.0
    if chain:
        n2, w2 = _witten_bell(chain, CHAIN_SMOOTHING)
        if n2 >= CHAIN_MIN_SUPPORT:
            scale = w2 / (n2 + w2)
            mixed = {c: q * scale for c, q in p.items()}
            for c, n in chain.items():
                if n > 0:
                    mixed[c] = mixed.get(c, 0.0) + n / (n2 + w2)
            p, unseen, used, support = mixed, unseen * scale, ContextUsed.CHAIN, n2
    return NextProbabilities(p, unseen, used, support)


def probability_of(
    edge: tuple[float, int, float], chain: tuple[float, int, float] | None = None
) -> float:
    """P(one executor next | context) from summaries of the context's counts, each ``(total,
    distinct successors, count to that executor)`` (counts of 0 left out): what
    :func:`next_probabilities` gives it, or, never seen after the context, its share of the
    unseen mass (:func:`unseen_probability`). ``vet`` reads these summaries in its one
    statement instead of every successor."""
    n1, t1, d1 = edge
    w1 = EDGE_SMOOTHING * t1
    p, unseen = (d1 / (n1 + w1), w1 / (n1 + w1)) if n1 > 0 else (0.0, 1.0)
    if chain is not None and chain[0] >= CHAIN_MIN_SUPPORT:
        n2, t2, d2 = chain
        w2 = CHAIN_SMOOTHING * t2
        scale = w2 / (n2 + w2)
        p = p * scale + d2 / (n2 + w2)
        unseen *= scale
    return p if p > 0 else unseen_probability(unseen)


def unseen_probability(unseen: float) -> float:
    """The probability of one executor never seen after the context: the unseen mass shared
    as if among :data:`UNSEEN_SUCCESSORS` executors."""
    return unseen / UNSEEN_SUCCESSORS


def chain_increments(
    links: Sequence[tuple[str, str]], counted: Sequence[bool]
) -> Counter[tuple[str, str, str]]:
    """The chains one turn adds: for each counted link ``(x, y)`` (in the turn's order), the
    latest earlier link of the turn that ended at ``x`` is its predecessor ``(w, x)``, and the
    chain ``(w, x, y)`` counts one passing. A link with no predecessor (the turn's first, a
    second branch of a fan-out from where the turn began) adds no chain."""
    came_from: dict[str, str] = {}
    out: Counter[tuple[str, str, str]] = Counter()
    for (src, dst), count in zip(links, counted, strict=True):
        before = came_from.get(src)
        if count and before is not None:
            out[(before, src, dst)] += 1
        came_from[dst] = src
    return out


# =============================================================================================
# The ager (contract §4) as pure functions over plain rows: the reference model that its
# set-based SQL (mnestoma.schema.sql.ager) must agree with, row by row and count by count.
# =============================================================================================

__all__ += [
    "LIVE",
    "LIVE_STATES",
    "VERSIONED_STATES",
    "AgerAction",
    "AgerDecision",
    "AgerRow",
    "advance",
    "age",
    "ager_decision",
    "archive_cutoff",
    "is_archive_candidate",
    "merge_demoted",
    "sql_list",
    "sql_literal",
]


class AgerAction(StrEnum):
    """What the ager does to one row, seen alone (a demotion becomes a merge when the key
    already has a decaying row: see :func:`merge_demoted`)."""

    KEEP = "keep"  # nothing written: decaying and superseded rows, live rows already at now
    DECAY = "decay"  # a live row's weight brought to now, ts_weight = now
    DEMOTE = "demote"  # an active row below DECAYING_BELOW becomes decaying, at its weight
    PRUNE = "prune"  # a proto below PROTO_PRUNE_BELOW is deleted (its events stay)


@dataclass(frozen=True, slots=True)
class AgerDecision:
    """The ager's decision on one row and the row's values after it."""

    action: AgerAction
    effective: float  # the effective weight at now, before the run
    state: MnestState  # after the run
    weight: float  # stored after the run (decaying rows keep theirs: not rewritten)
    ts_weight: datetime  # after the run
    archive_candidate: bool  # counted in AgerReport.archive_candidates after the run


def archive_cutoff(now: datetime) -> datetime:
    """The newest ``ts_last`` that a decaying row may have to be an archive candidate."""
    return now - timedelta(days=ARCHIVE_AFTER_DAYS)


def is_archive_candidate(state: str, effective: float, ts_last: datetime, now: datetime) -> bool:
    """A decaying row whose effective weight at ``now`` is below :data:`ARCHIVE_BELOW` and
    whose last passing is at least :data:`ARCHIVE_AFTER_DAYS` days old: counted, never
    deleted."""
    return (
        state == MnestState.DECAYING
        and is_below(effective, ARCHIVE_BELOW)
        and ts_last <= archive_cutoff(now)
    )


def ager_decision(
    state: str,
    weight: float,
    decay_lambda: float,
    ts_weight: datetime,
    ts_last: datetime,
    now: datetime,
) -> AgerDecision:
    """What the ager does at ``now`` to one row with these values, seen alone."""
    current = MnestState(state)
    effective = decayed_weight(weight, decay_lambda, ts_weight, now)
    if current == MnestState.PROTO and is_below(effective, PROTO_PRUNE_BELOW):
        return AgerDecision(AgerAction.PRUNE, effective, current, effective, ts_weight, False)
    if current == MnestState.ACTIVE and is_below(effective, DECAYING_BELOW):
        anchor = advance(ts_weight, now)
        at_anchor = decayed_weight(effective, decay_lambda, anchor, now)
        candidate = is_archive_candidate(MnestState.DECAYING, at_anchor, ts_last, now)
        return AgerDecision(
            AgerAction.DEMOTE, effective, MnestState.DECAYING, effective, anchor, candidate
        )
    if current in LIVE_STATES and ts_weight < now:
        return AgerDecision(AgerAction.DECAY, effective, current, effective, now, False)
    candidate = is_archive_candidate(current, effective, ts_last, now)
    return AgerDecision(AgerAction.KEEP, effective, current, weight, ts_weight, candidate)


@dataclass(frozen=True, slots=True)
class AgerRow:
    """A row of ``mnests`` as the ager sees it (the columns it reads or writes)."""

    id: str
    src_executor: str
    src_version: str
    dst_executor: str
    dst_version: str | None
    state: MnestState
    weight: float
    uses: int
    ts_first: datetime
    ts_last: datetime
    ts_weight: datetime
    decay_lambda: float = DEFAULT_DECAY_LAMBDA
    ok_count: int = 0
    error_count: int = 0
    decayed_uses: float = 1.0

    @classmethod
    def of(cls, row: AgerRow | Mapping[str, Any]) -> AgerRow:
        """An :class:`AgerRow` from itself or a mapping keyed by column name (extra keys,
        such as ``tags``, are ignored)."""
        if isinstance(row, AgerRow):
            return row
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        values["state"] = MnestState(values["state"])
        return cls(**values)

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        """The edge key without the state: (src, src_version, dst, dst_version)."""
        return (self.src_executor, self.src_version, self.dst_executor, self.dst_version)

    def decision(self, now: datetime) -> AgerDecision:
        """:func:`ager_decision` for this row."""
        return ager_decision(
            self.state, self.weight, self.decay_lambda, self.ts_weight, self.ts_last, now
        )

    def effective_weight(self, at: datetime) -> float:
        """The weight at instant ``at``."""
        return decayed_weight(self.weight, self.decay_lambda, self.ts_weight, at)


# The counters two rows of one edge add up when they merge (the ager's demotion merges,
# ``copy --append``, the seed repair): every passing either row counted stays counted.
SUMMED_ON_MERGE: tuple[str, ...] = ("uses", "ok_count", "error_count")


def merge_demoted(active: AgerRow, decaying: AgerRow, now: datetime) -> AgerRow:
    """The decaying row after an active row of the same key, demoted at ``now``, merged into
    it: uses and outcome counts summed, the decayed counts summed at the later ts_last
    (:func:`merged_count`), ts_first the earlier, ts_last the later, weight the
    larger of the two effective weights, ts_weight moved to now (never backwards). The
    active row is deleted."""
    summed = {c: getattr(decaying, c) + getattr(active, c) for c in SUMMED_ON_MERGE}
    count, last = merged_count(
        (decaying.decayed_uses, decaying.decay_lambda, decaying.ts_last),
        (active.decayed_uses, active.decay_lambda, active.ts_last),
    )
    return replace(
        decaying,
        **summed,
        decayed_uses=count,
        ts_first=min(decaying.ts_first, active.ts_first),
        ts_last=last,
        weight=max(active.effective_weight(now), decaying.effective_weight(now)),
        ts_weight=advance(decaying.ts_weight, now),
    )


def age(
    rows: Iterable[AgerRow | Mapping[str, Any]], now: datetime
) -> tuple[list[AgerRow], AgerReport]:
    """The whole ager at ``now`` over plain rows: the rows left (in their given order, a
    merged row where its decaying twin was) and the report, as ``apply_ager`` must do them."""
    given = [AgerRow.of(r) for r in rows]
    out = {r.id: r for r in given}
    gone: set[str] = set()
    twins = {r.key: r.id for r in given if r.state == MnestState.DECAYING}
    pruned = merged = demoted = decayed = 0
    for row in given:
        decision = row.decision(now)
        if decision.action == AgerAction.PRUNE:
            gone.add(row.id)
            pruned += 1
        elif decision.action == AgerAction.DEMOTE and row.key in twins:
            twin = out[twins[row.key]]
            out[twin.id] = merge_demoted(row, twin, now)
            gone.add(row.id)
            merged += 1
        elif decision.action in (AgerAction.DEMOTE, AgerAction.DECAY):
            out[row.id] = replace(
                row, state=decision.state, weight=decision.weight, ts_weight=decision.ts_weight
            )
            demoted += decision.action == AgerAction.DEMOTE
            decayed += decision.action == AgerAction.DECAY
    left = [r for r in out.values() if r.id not in gone]
    archive = sum(
        is_archive_candidate(
            r.state, decayed_weight(r.weight, r.decay_lambda, r.ts_weight, now), r.ts_last, now
        )
        for r in left
    )
    report = AgerReport(
        decayed=decayed,
        to_decaying=demoted + merged,
        merged=merged,
        protos_pruned=pruned,
        archive_candidates=archive,
    )
    return left, report
