"""The writer-latency benchmark measures what it says: open loop, errors counted, every phase.

No figure is asserted against a target here; these tests check the accounting (a call due
during a stall counts the stall, errors are counted by type) and that every phase runs on
both engines at a tiny size.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from conftest import REPO
from sqlalchemy import exc as sa_exc

ROOT = REPO
if str(ROOT) not in sys.path:  # ``benchmarks`` lives at the top of the checkout
    sys.path.insert(0, str(ROOT))

from conftest import PG_ADMIN_URL  # noqa: E402

from benchmarks import writer_latency as wl  # noqa: E402
from benchmarks.data import PostgresServer, SqliteFiles  # noqa: E402
from mnestoma.maintenance.migration import head_revision  # noqa: E402

TINY = wl.Settings(
    writers=2,
    period_s=0.01,
    idle_s=0.2,
    lead_s=0.1,
    tail_s=0.05,
    events_per_row=5,
    edges_per_writer=20,
    maintenance_in="thread",
)


class FakeTime:
    """A clock that moves only when slept on or when a call says it took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _one_writer(
    call: Callable[[int, int], object], fake: FakeTime, until: float = 0.5
) -> list[wl.Call]:
    calls: list[wl.Call] = []
    wl.writer_loop(
        0,
        call,
        start=0.0,
        period=0.01,
        until=lambda: until,
        record=calls.append,
        clock=fake.clock,
        sleep=fake.sleep,
    )
    return calls


def test_a_call_due_during_a_stall_counts_the_stall_from_its_due_time() -> None:
    fake = FakeTime()

    def call(_writer: int, k: int) -> None:
        fake.now += 0.200 if k == 3 else 0.001  # call 3 stalls 200 ms

    calls = _one_writer(call, fake)
    # every call due before the end was made: the stall did not remove the calls it delayed
    assert [c.due for c in calls] == pytest.approx([k * 0.01 for k in range(50)])
    lat = [c.latency for c in calls]
    assert lat[3] == pytest.approx(0.200)
    # call 4 was due at 40 ms, started when call 3 ended (230 ms), took 1 ms
    assert lat[4] == pytest.approx(0.191)
    assert lat[10] == pytest.approx(0.137)
    # the writer catches up 9 ms a period: calls 3..25 are late, the others take 1 ms
    late = [k for k, x in enumerate(lat) if x > 0.0011]
    assert late == list(range(3, 26))
    window = wl.summarize(calls)
    assert window.calls == 50
    assert window.max_ms == pytest.approx(200)
    assert window.p99_ms == pytest.approx(200)
    assert window.p50_ms == pytest.approx(1)  # 27 of 50 on time
    # a closed-loop count (latency from each call's start) would have seen one slow call
    assert sum(x >= 0.1 for x in lat) == 12
    # the timeline shows when the writer waited: per 100 ms of due times, the longest wait
    steps = wl.timeline(calls, -0.005, step=0.1)
    assert [(t, n) for t, n, _ in steps] == [(0.0, 10), (0.1, 10), (0.2, 10), (0.3, 10), (0.4, 10)]
    assert [m for _, _, m in steps] == pytest.approx([200, 137, 47, 1, 1])


def test_a_late_writer_runs_at_once_and_an_early_one_sleeps_until_due() -> None:
    fake = FakeTime()
    fake.now = 0.05  # the writer starts 50 ms late
    starts: list[float] = []

    def call(_writer: int, _k: int) -> None:
        starts.append(fake.now)
        fake.now += 0.002

    calls = _one_writer(call, fake, until=0.1)
    assert len(calls) == 10
    assert starts[:6] == pytest.approx([0.05, 0.052, 0.054, 0.056, 0.058, 0.060])
    assert starts[6:] == pytest.approx([0.062, 0.07, 0.08, 0.09])  # caught up: on schedule
    assert calls[0].latency == pytest.approx(0.052)


def test_errors_are_counted_by_type_and_the_writer_goes_on() -> None:
    fake = FakeTime()
    deadlock = sa_exc.OperationalError(
        "UPDATE mnests ...", {}, psycopg.errors.DeadlockDetected("deadlock detected")
    )

    def call(_writer: int, k: int) -> None:
        fake.now += 0.001
        if k == 7:
            raise deadlock
        if k % 5 == 0:
            raise ValueError("bad")

    calls = _one_writer(call, fake)
    assert len(calls) == 50
    window = wl.summarize(calls)
    assert window.errors == {"OperationalError(DeadlockDetected)": 1, "ValueError": 10}
    assert window.error_count == 11
    assert window.max_ms == pytest.approx(1)  # a failed call's wait counts like any other
    # a window keeps the errors of the calls due in it only
    assert wl.summarize(calls, 0.0, 0.1).errors == {
        "OperationalError(DeadlockDetected)": 1,
        "ValueError": 2,
    }


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert wl.percentile(values, 0.5) == 50.0
    assert wl.percentile(values, 0.99) == 99.0
    assert wl.percentile(values, 1.0) == 100.0
    assert wl.percentile([7.0], 0.99) == 7.0
    assert wl.percentile([], 0.5) is None
    assert wl.summarize([]).p99_ms is None


def test_writer_threads_waiting_behind_a_maintenance_count_its_whole_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = threading.Lock()

    def prepare_stall(seconds: float) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            with gate:
                time.sleep(seconds)
            return {"held": seconds}

        return run

    def call(_writer: int, _k: int) -> None:
        with gate:
            pass

    monkeypatch.setitem(wl.JOBS, "stall", prepare_stall)
    job = wl.Maintenance("stall", "thread", seconds=0.3).prepare()
    window, outcome, calls = wl.measure(call, TINY, job)
    assert outcome is not None and outcome.result == {"held": 0.3}
    assert outcome.seconds >= 0.3
    # 2 writers × 1 call / 10 ms during ≥ 0.3 s: each call due in it ended after it
    assert window.calls >= 55
    assert window.max_ms is not None and window.max_ms >= 0.9 * outcome.seconds * 1e3
    assert window.p50_ms is not None and window.p50_ms >= 100
    assert window.error_count == 0
    # the calls due before the maintenance started (the lead) are not in the window
    assert len(calls) > window.calls


@pytest.mark.slow
def test_a_maintenance_process_reports_its_run_on_this_process_clock() -> None:
    job = wl.Maintenance("sleep", "process", seconds=0.2).prepare()
    before = time.monotonic()
    outcome = job.run()
    after = time.monotonic()
    assert outcome.error is None and outcome.result == {"slept": 0.2}
    assert before <= outcome.start < outcome.end <= after
    assert outcome.seconds >= 0.2


def test_a_maintenance_that_fails_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def prepare_fail() -> Callable[[], None]:
        def run() -> None:
            raise RuntimeError("disk full")

        return run

    monkeypatch.setitem(wl.JOBS, "fail", prepare_fail)
    outcome = wl.Maintenance("fail", "thread").prepare().run()
    assert outcome.error == "RuntimeError: disk full"
    assert outcome.result is None


def test_every_phase_runs_on_a_tiny_store(engine_name: str, tmp_path: Path) -> None:
    pg = PostgresServer(PG_ADMIN_URL) if engine_name == "postgresql" else None
    sides = wl.Sides(SqliteFiles(tmp_path), pg)
    rows = 300
    try:
        results = wl.run_engine(engine_name, rows, TINY, sides)
    finally:
        sides.files.close()
        if pg is not None:
            pg.close()
    phases = [r.phase for r in results]
    expected = ["idle", "ager", "retention"] + (["upgrade"] if pg else [])
    assert phases == expected
    by = {r.phase: r for r in results}
    for r in results:
        assert r.engine == engine_name and r.rows == rows
        assert "maintenance_error" not in r.detail, r.detail
        # a maintenance this small may end between two calls: its window can be empty
        assert r.all_calls > 0 and r.all_calls >= r.window.calls, r.phase
        if r.window.calls:
            w = r.window
            assert w.max_ms is not None and w.p99_ms is not None and w.p50_ms is not None
            assert w.max_ms >= w.p99_ms >= w.p50_ms > 0
        # the timeline covers every call, from the lead to the tail
        assert sum(n for _, n, _ in r.detail["timeline"]) == r.all_calls
        assert r.detail["timeline"][0][0] < 0  # the lead, before the window
    assert by["idle"].maintenance_s is None
    assert by["idle"].window.calls >= 30  # 2 writers × 0.2 s / 10 ms
    assert by["idle"].detail["events"] == rows * TINY.events_per_row
    ager = by["ager"].detail["result"]
    # the clock 30 days on: the ager decays, demotes and merges
    assert ager["decayed"] > 0 and ager["to_decaying"] > 0 and ager["merged"] > 0
    # the loaded reinforced events go; each live row keeps its created event
    deleted = by["retention"].detail["result"]["deleted"]
    assert rows * (TINY.events_per_row - 1) <= deleted < rows * TINY.events_per_row
    if pg is not None:
        up = by["upgrade"]
        assert up.detail["result"] == {"from": wl.OLD_REVISION, "to": head_revision()}
        assert up.maintenance_s is not None and up.maintenance_s > 0
    table = wl.format_table(results).splitlines()
    assert len(table) == 2 + len(expected)
    for line, phase in zip(table[2:], expected, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == [engine_name, f"{rows:,}", phase]


def test_the_table_shows_errors_by_type_and_a_failed_maintenance() -> None:
    window = wl.Window(10, 1.0, 5.0, 9.0, {"OperationalError(DeadlockDetected)": 4})
    result = wl.PhaseResult(
        "postgresql", 300_000, "upgrade", window, 5.2, {"maintenance_error": "boom"}
    )
    (row,) = wl.format_table([result]).splitlines()[2:]
    assert "4 (OperationalError(DeadlockDetected) × 4)" in row
    assert "5.20 (failed)" in row


def test_the_command_line_prints_a_row_per_phase_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "wl.json"
    code = wl.main(
        ["--engines", "sqlite", "--sizes", "200", "--maintenance-in", "thread",
         "--writers", "2", "--idle-s", "0.2", "--lead-s", "0.1", "--tail-s", "0.05",
         "--events-per-row", "3", "--workdir", str(tmp_path), "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "| engine" in text and "p99 ms" in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()]
    assert [r[:3] for r in rows if r[0] == "sqlite"] == [
        ["sqlite", "200", phase] for phase in ("idle", "ager", "retention")
    ]
    data = json.loads(out.read_text())
    assert [r["phase"] for r in data["results"]] == ["idle", "ager", "retention"]
    assert data["settings"]["writers"] == 2
    assert all("p99_ms" in r["window"] and "errors" in r["window"] for r in data["results"])


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        wl.run(["sqlite"], [100], wl.Settings(phases=("vacuum",)), postgresql=None)


def test_the_plain_disk_writer_writes_its_bytes_at_the_pace_asked_and_removes_its_file(
    tmp_path: Path,
) -> None:
    nbytes = 5 * wl.DISK_CHUNK + 1  # six chunks, the last one whole
    start = time.monotonic()
    result = wl.JOBS["disk"](folder=str(tmp_path), nbytes=nbytes, seconds=0.3)()
    took = time.monotonic() - start
    assert result == {"written_mb": round(6 * wl.DISK_CHUNK / 1e6, 1), "paced_s": 0.3}
    assert took >= 0.3 * 5 / 6  # the sixth chunk is due 5/6 of the way in
    assert list(tmp_path.iterdir()) == []


def test_disk_written_grows_when_a_file_on_that_disk_is_synced(tmp_path: Path) -> None:
    before = wl.disk_written(tmp_path)
    if before is None:
        pytest.skip("no /proc/diskstats line for this folder's disk (not Linux, or no disk)")
    wl.JOBS["disk"](folder=str(tmp_path), nbytes=4 * wl.DISK_CHUNK, seconds=0.0)()
    after = wl.disk_written(tmp_path)
    assert after is not None and after - before >= 4 * wl.DISK_CHUNK


def test_the_disk_phase_replays_the_bytes_the_ager_made_the_disk_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the disk's counter: unchanged around idle (the writers write nothing), 2 MB more
    # around the ager
    readings = iter([1_000, 1_000, 1_000, 1_000 + 2_000_000])
    monkeypatch.setattr(wl, "disk_written", lambda _path: next(readings))
    asked: dict[str, object] = {}
    real = wl.JOBS["disk"]

    def disk(**kwargs: object) -> Callable[[], object]:
        asked.update(kwargs)
        return real(**kwargs)

    monkeypatch.setitem(wl.JOBS, "disk", disk)
    s = replace(TINY, phases=("idle", "ager", "disk"), maintenance_in="thread")
    sides = wl.Sides(SqliteFiles(tmp_path))
    try:
        results = wl.run_engine("sqlite", 300, s, sides)
    finally:
        sides.files.close()
    by = {r.phase: r for r in results}
    assert [r.phase for r in results] == ["idle", "ager", "disk"]
    assert by["idle"].detail["disk_mb_per_s"] == 0.0
    assert by["ager"].detail["disk_mb"] == 2.0
    assert asked == {
        "folder": str(tmp_path),
        "nbytes": 2_000_000,
        "seconds": by["ager"].maintenance_s,
    }
    assert by["disk"].detail["result"]["written_mb"] == round(8 * wl.DISK_CHUNK / 1e6, 1)
    assert "the disk wrote 2.0 MB for it" in "\n".join(wl.format_notes(results))


def test_the_disk_phase_without_idle_and_ager_is_refused() -> None:
    with pytest.raises(ValueError, match="disk phase"):
        wl.run(["sqlite"], [100], wl.Settings(phases=("ager", "disk")), postgresql=None)
