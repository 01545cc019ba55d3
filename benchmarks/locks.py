"""PostgreSQL: who waits for whom while a measurement runs, from ``pg_stat_activity`` and
``pg_locks`` sampled every few milliseconds on a connection of its own.

``with LockSampler(url) as s: ...`` then ``s.summary(lo, hi)``: for each kind of wait seen
(whether one of the measured writers waited; the start of its statement and its wait
event; the lock it asked for, on which relation; the statements of the sessions blocking
it), how many samples saw it and the longest run of consecutive samples, so that a
writer's stall can be put down to what held it up, or to nothing the server shows (a
stall of the client, the operating system).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

# Every backend of the database but the sampler's own that is not idle, with what it waits
# for, the locks it has not been granted and the statements of the sessions blocking it.
_SAMPLE = """
SELECT a.pid,
       coalesce(a.application_name, '') AS app,
       coalesce(a.wait_event_type, '') AS wait_type,
       coalesce(a.wait_event, '') AS wait_event,
       left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 70) AS query,
       coalesce((SELECT string_agg(l.mode || ' on ' || coalesce(l.relation::regclass::text,
                                   l.locktype), ', ')
                 FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted), '') AS waiting_for,
       coalesce((SELECT string_agg(DISTINCT left(regexp_replace(coalesce(b.query, ''), '\\s+',
                                   ' ', 'g'), 50) || ' [' || coalesce(b.backend_type, '') || ']',
                                   ' | ')
                 FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid))),
                '') AS blocked_by
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid()
  AND (a.datname = current_database() OR a.backend_type = 'autovacuum worker')
  AND a.state IS DISTINCT FROM 'idle'
  AND a.wait_event_type IN ('Lock', 'LWLock', 'IO', 'IPC', 'BufferPin')
"""


# The application name the measured writers connect with, so that their waits are told
# apart from the operation's (``writer_url``).
WRITERS_APP = "mnestoma-bench-writer"


def writer_url(url: str) -> str:
    """``url`` with the writers' application name."""
    return f"{url}{'&' if '?' in url else '?'}application_name={WRITERS_APP}"


class LockSampler:
    """Samples the database's waits every ``every_s`` seconds in a thread of its own."""

    def __init__(self, url: str, every_s: float = 0.005) -> None:
        self.url = url
        self.every_s = every_s
        self.samples: list[tuple[float, list[tuple[Any, ...]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.rounds = 0

    def _run(self) -> None:
        from sqlalchemy import create_engine, text

        engine = create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                statement = text(_SAMPLE)
                while not self._stop.is_set():
                    at = time.monotonic()
                    rows = [tuple(r) for r in conn.execute(statement)]
                    self.rounds += 1
                    if rows:
                        self.samples.append((at, rows))
                    time.sleep(self.every_s)
        finally:
            engine.dispose()

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def summary(self, lo: float = 0.0, hi: float = float("inf"), top: int = 8) -> dict[str, Any]:
        """The kinds of wait seen between ``lo`` and ``hi`` (monotonic), the most seen
        first: samples, the longest run of consecutive samples in seconds, and whether any
        was a heavyweight lock."""
        seen: dict[tuple[str, ...], list[float]] = defaultdict(list)
        for at, rows in self.samples:
            if lo <= at <= hi:
                for _pid, app, wtype, wevent, query, waiting, blocked in rows:
                    who = "writers" if app == WRITERS_APP else "others"
                    seen[(who, f"{wtype}/{wevent}", query, waiting, blocked)].append(at)
        kinds: list[dict[str, Any]] = []
        for (who, wait, query, waiting, blocked), ats in seen.items():
            longest, run_start, last = 0.0, ats[0], ats[0]
            for at in ats[1:]:
                if at - last > 3 * max(self.every_s, 0.02):
                    run_start = at
                last = at
                longest = max(longest, last - run_start)
            kinds.append(
                {
                    "who": who,
                    "wait": wait,
                    "statement": query,
                    "lock_wanted": waiting or None,
                    "blocked_by": blocked or None,
                    "samples": len(ats),
                    "longest_s": round(longest, 3),
                }
            )
        kinds.sort(key=lambda k: (-k["longest_s"], -k["samples"]))
        lock_waits = [k for k in kinds if k["wait"].startswith("Lock/")]
        writers = [k for k in kinds if k["who"] == "writers"]
        return {
            "rounds": self.rounds,
            "longest_lock_wait_s": max((k["longest_s"] for k in lock_waits), default=0.0),
            "waits": kinds[:top],
            "writers_waits": writers[:top],
        }


class StatementTimes:
    """The time each statement the entering thread runs takes (SQLAlchemy's cursor events
    on every engine), while it is entered and until :meth:`stop`: what an operation's time
    goes on, beside what the server shows it waiting for."""

    def __init__(self) -> None:
        self.times: list[tuple[float, str]] = []
        self._started: dict[int, float] = {}
        self._on = False
        self._thread = threading.get_ident()

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self._on and threading.get_ident() == self._thread:
            self._started[id(cursor)] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        began = self._started.pop(id(cursor), None)
        if self._on and began is not None:
            self.times.append((time.perf_counter() - began, " ".join(statement.split())[:70]))

    def __enter__(self) -> StatementTimes:
        from sqlalchemy import Engine, event

        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)
        self._on = True
        return self

    def stop(self) -> None:
        """No statement is timed from now on."""
        self._on = False

    def __exit__(self, *exc: object) -> None:
        from sqlalchemy import Engine, event

        self._on = False
        event.remove(Engine, "before_cursor_execute", self._before)
        event.remove(Engine, "after_cursor_execute", self._after)

    def summary(self, top: int = 6) -> dict[str, Any]:
        """How many statements, their time in all, and the slowest."""
        slowest = sorted(self.times, reverse=True)[:top]
        return {
            "statements": len(self.times),
            "total_s": round(sum(t for t, _ in self.times), 3),
            "slowest": [{"s": round(t, 3), "statement": text} for t, text in slowest],
        }
