"""Worker functions run in child processes (spawn context) by the reliability tests, and
``run_python``, which runs code in a fresh interpreter.

Each child builds its own ``Mnestoma(url)``; results travel back through a queue as plain
dicts: how many passings each edge key was given, and every exception seen (as text).
"""

from __future__ import annotations

import faulthandler
import itertools
import multiprocessing
import multiprocessing.context
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Plugins that packages of the test extra install and that no child pytest of the suite uses:
# a child that loaded them would spend seconds importing them for nothing it tests.
PLUGINS_OFF = tuple(
    arg
    for name in ("langsmith_plugin", "faker", "anyio", "hypothesispytest", "pytest_alembic")
    for arg in ("-p", f"no:{name}")
)

# A child that crashes in C (a segfault) prints every thread's Python stack before it dies:
# its parent's test then says which call it was in (children forked from the forkserver
# inherit the handler the server installed when it imported this module).
faulthandler.enable()

HOT_EDGE = ("hot", "1", "sink", "1")
HOT_PROTO = ("hot", "1", "wish", None)
COLD_EDGES = 48


def key_of(src: str, src_version: str, dst: str, dst_version: str | None) -> str:
    """A printable edge key (queues carry it between processes)."""
    return f"{src}@{src_version}->{dst}@{dst_version}"


def _cold(rng: random.Random) -> tuple[str, str, str, str]:
    return ("cold", "1", f"c{rng.randrange(COLD_EDGES)}", "1")


def _error_text(err: BaseException) -> str:
    import mnestoma

    kind = "package" if isinstance(err, mnestoma.MnestomaError) else "RAW"
    return f"{kind} {type(err).__name__}: {err}"


def writer_process(
    url: str,
    proc: int,
    threads: int,
    calls: int,
    start: Any,
    out: Any,
    seed: int = 0,
    budget: float = 600.0,
    until: Any = None,
) -> None:
    """``threads`` threads each make ``calls`` calls: hot edge, hot proto, cold edges, turns.

    A thread stops early once ``budget`` seconds have passed (a bound for CI, should the
    store slow down); every call it made is counted. With ``until`` (an event), it goes on
    past ``calls``, on the hot edge, until the event is set, so that what it races has the
    time to run.
    """
    import mnestoma
    from mnestoma import Passing

    counts: Counter[str] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    store = mnestoma.Mnestoma(url)
    store.get("mn_warmupwarmupwarmup")  # connect before the start line

    def work(thread: int) -> None:
        rng = random.Random(seed * 1_000_003 + proc * 1009 + thread)
        mine: Counter[str] = Counter()
        for i in itertools.count():
            if time.monotonic() > t0 + budget:
                break
            if i >= calls and (until is None or until.is_set()):
                break
            choice = i % 4 if i < calls else 0  # going on: the hot edge only, so that
            # the cold edges keep the few uses that leave the ager something to demote
            try:
                if choice == 0:
                    store.record_passing(*HOT_EDGE)
                    mine[key_of(*HOT_EDGE)] += 1
                elif choice == 1:
                    store.record_passing(
                        *HOT_PROTO[:3], dst_exists=False, desired_sig={"summary": f"v{i}"}
                    )
                    mine[key_of(*HOT_PROTO)] += 1
                elif choice == 2:
                    cold = _cold(rng)
                    store.record_passing(*cold)
                    mine[key_of(*cold)] += 1
                else:
                    cold = _cold(rng)
                    turn = f"t-{seed}-{proc}-{thread}-{i}"
                    store.record_turn(
                        turn,
                        [
                            Passing(*HOT_EDGE),
                            Passing(*cold),
                            Passing(*HOT_PROTO[:3], dst_exists=False),
                        ],
                    )
                    for k in (HOT_EDGE, cold, HOT_PROTO):
                        mine[key_of(*k)] += 1
            except Exception as err:
                with lock:
                    errors.append(_error_text(err))
        with lock:
            counts.update(mine)

    start.wait(60)
    t0 = time.monotonic()
    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - t0
    store.close()
    out.put({"proc": proc, "counts": dict(counts), "errors": errors, "elapsed": elapsed})


def ager_process(
    url: str,
    offset_days: float,
    start: Any,
    stop: Any,
    out: Any,
    max_runs: int = 1_000_000,
    budget: float = 600.0,
    ran: Any = None,
) -> None:
    """Run the ager with a clock ``offset_days`` ahead until ``stop`` is set or ``max_runs``;
    ``ran`` (an event) is set once two runs are done."""
    import mnestoma

    def clock() -> datetime:
        return datetime.now(UTC) + timedelta(days=offset_days)

    store = mnestoma.Mnestoma(url, clock=clock)
    reports: list[dict[str, int]] = []
    errors: list[str] = []
    start.wait(60)
    t0 = time.monotonic()
    while True:
        try:
            r = store.apply_ager()
            reports.append(
                {
                    "decayed": r.decayed,
                    "to_decaying": r.to_decaying,
                    "merged": r.merged,
                    "protos_pruned": r.protos_pruned,
                    "archive_candidates": r.archive_candidates,
                }
            )
        except Exception as err:
            errors.append(_error_text(err))
        runs = len(reports) + len(errors)
        if ran is not None and runs >= 2:
            ran.set()
        if stop.is_set() or runs >= max_runs or time.monotonic() > t0 + budget:
            break
        time.sleep(0.02)
    store.close()
    out.put({"proc": "ager", "reports": reports, "errors": errors})


def same_turn_process(url: str, proc: int, turns: int, start: Any, out: Any) -> None:
    """Record the same turns (ids and edges) as a sibling process, as fast as possible."""
    import mnestoma

    store = mnestoma.Mnestoma(url)
    store.get("mn_warmupwarmupwarmup")
    errors: list[str] = []
    start.wait(60)
    for n in range(turns):
        edges = [("a", "1", f"b{n % 5}", "1"), ("a", "1", "hub", "1"), ("a", "1", f"w{n % 3}")]
        try:
            if n % 2 == 0:
                store.record_turn(
                    f"turn-{n}",
                    [edges[0], edges[1], (*edges[2], None, False)],
                )
            else:
                # the same turn as single passings, in another order in each process
                order = [0, 1, 2] if proc % 2 == 0 else [2, 1, 0]
                for i in order:
                    e = edges[i]
                    if len(e) == 3:
                        store.record_passing(*e, dst_exists=False, turn_id=f"turn-{n}")
                    else:
                        store.record_passing(*e, turn_id=f"turn-{n}")
        except Exception as err:
            errors.append(_error_text(err))
    store.close()
    out.put({"proc": proc, "errors": errors})


def _kill_after_statements(engine: Any, n: int) -> Any:
    """Arm a hook that SIGKILLs this process right after its ``n``-th SQL statement."""
    from sqlalchemy import event

    seen = {"count": 0, "armed": False}

    def after(*_args: Any) -> None:
        if seen["armed"]:
            seen["count"] += 1
            if seen["count"] >= n:
                os.kill(os.getpid(), signal.SIGKILL)

    event.listen(engine, "after_cursor_execute", after)
    return seen


def killed_turn_process(url: str, turn_id: str, passings: list[tuple[Any, ...]], n: int) -> None:
    """Record a turn and SIGKILL this process after the ``n``-th statement of the call."""
    import mnestoma

    store = mnestoma.Mnestoma(url)
    store.get("mn_warmupwarmupwarmup")
    seen = _kill_after_statements(store.engine, n)
    seen["armed"] = True
    store.record_turn(turn_id, passings)
    os._exit(0)  # n was past the last statement: the turn committed


def killed_at_commit_process(url: str, when: str) -> None:
    """Record one passing through the facade and SIGKILL this process ``when`` ("before" or
    "after") it is committed at the driver (SQLite: the COMMIT right after its statements,
    which have run; PostgreSQL: the statement and its COMMIT, one pipeline). Nobody
    observes the statements: a listener would send them through SQLAlchemy."""
    import mnestoma
    from mnestoma.schema.runner import DriverRunner

    store = mnestoma.Mnestoma(url)
    store.get("mn_warmupwarmupwarmup")
    name = "first_committing" if store.engine.dialect.name == "postgresql" else "_commit_at_driver"
    original = getattr(DriverRunner, name)

    def killing(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(DriverRunner, name, killing)
    store.record_passing("kc", "1", "dst", "1")
    os._exit(0)  # never reached: the write commits at the driver, killed around it


def killed_ager_process(url: str, now_iso: str, n: int) -> None:
    """Run the ager at ``now`` and SIGKILL this process after its ``n``-th statement."""
    import mnestoma

    now = datetime.fromisoformat(now_iso)
    store = mnestoma.Mnestoma(url, clock=lambda: now)
    store.get("mn_warmupwarmupwarmup")
    seen = _kill_after_statements(store.engine, n)
    seen["armed"] = True
    store.apply_ager()
    os._exit(0)


def turn_loop_process(url: str, prefix: str, size: int, ready: Any) -> None:
    """Record big turns back to back until killed from outside."""
    import mnestoma

    store = mnestoma.Mnestoma(url)
    store.get("mn_warmupwarmupwarmup")
    ready.set()
    n = 0
    while True:
        passings = [("big", "1", f"d{i}", str(n % 3)) for i in range(size)]
        store.record_turn(f"{prefix}-{n}", passings)
        n += 1


def format_exception(err: BaseException) -> str:
    """The full traceback text of ``err`` (to check that no secret leaks through it)."""
    return "".join(traceback.format_exception(err))


def warm_processes() -> multiprocessing.context.ForkServerContext:
    """The start method for the suite's child processes that use the package: forkserver,
    whose server imports the package once and forks each child from it, where spawn
    imported it again in each (about a second of CPU apiece). Each child is still a process
    of its own, with its own engines and connections; the server holds none when it forks.
    (The server is this process's one forkserver: its imports are set before it starts.)"""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["mnestoma", "helpers_proc"])
    return ctx


def run_python(
    code: str, cwd: Path | str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter in a fresh process (in ``cwd``), its output captured
    as text; the caller judges the exit code."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
