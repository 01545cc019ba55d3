"""What the commands print: tables for people, JSON for scripts (one object per row, keyed
by column name, times in ISO-8601 UTC; see :mod:`mnestoma.core.records`)."""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mnestoma.cli.errors import CliFailure
from mnestoma.cli.progress import stderr_is_terminal
from mnestoma.core.clock import utc_now
from mnestoma.core.display import json_for_terminal, state_word, text_for_terminal
from mnestoma.core.errors import InvalidInput
from mnestoma.core.records import mnest_record, row_record
from mnestoma.core.redaction import redact_url
from mnestoma.core.rules import DECAYED_USES_ORDER, AgerReport, ContextUsed, activation
from mnestoma.core.timefmt import iso_utc, short_utc
from mnestoma.schema.models import CanonicalQuery, Event, Mnest
from mnestoma.store.repository import QueryFrequency

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from mnestoma.maintenance.copying import CopyReport
    from mnestoma.maintenance.splitting import SplitReport
    from mnestoma.planner.planning import Forecast
    from mnestoma.planner.vetting import Verdict

__all__ = [
    "check_output_path",
    "counted",
    "echo_json",
    "endpoint",
    "megabytes",
    "render_ager",
    "render_copy",
    "render_edges",
    "render_events",
    "render_forecast",
    "render_graph_report",
    "render_one",
    "render_protos",
    "render_prune",
    "render_recent_queries",
    "render_split",
    "render_store",
    "render_suggestions",
    "render_top_queries",
    "render_verdict",
    "render_walk",
    "table",
    "write_output",
]

# Names of the tables a copy fills, as its summary line says them.
COPY_LABELS = {
    "mnests": ("mnest", "mnests"),
    "events": ("event", "events"),
    "canonical_query_log": ("query-log entry", "query-log entries"),
    "ager_runs": ("ager run", "ager runs"),
    "mnest_chains": ("chain", "chains"),
}


def counted(n: int, one: str, many: str) -> str:
    """``n`` and what it counts, singular for 1 ("1 ager run", "0 ager runs")."""
    return f"{n} {one if n == 1 else many}"


def echo_json(data: Any) -> None:
    """``data`` as indented JSON on stdout, no control character raw (C1 as ``\\u`` escapes)."""
    click.echo(json_for_terminal(json.dumps(data, indent=2, ensure_ascii=False, default=str)))


def _fmt_weight(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[str]) -> str:
    """Rows under their headers, columns padded; the columns in ``right`` right-aligned; a
    cell's control characters escaped (:func:`~mnestoma.core.display.text_for_terminal`)."""
    cells = [[("-" if v is None else text_for_terminal(str(v))) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if headers[i] in right else v.ljust(widths[i])
            for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def endpoint(executor: str, version: str | None) -> str:
    """``executor@version``, or the bare executor when it has no version (a wish)."""
    return executor if version is None else f"{executor}@{version}"


def _summary(m: Mnest) -> str | None:
    if isinstance(m.desired_sig, dict):
        summary = m.desired_sig.get("summary")
        return str(summary) if summary is not None else None
    return None


def render_edges(edges: Sequence[Mnest], at: datetime, as_json: bool, empty: str) -> None:
    """Print mnests as a table (effective weight at ``at``) or as a JSON array."""
    if as_json:
        echo_json([mnest_record(m, at) for m in edges])
        return
    if not edges:
        click.echo(empty)
        return
    rows = [
        (
            m.id,
            endpoint(m.src_executor, m.src_version),
            endpoint(m.dst_executor, m.dst_version),
            state_word(m.state),
            _fmt_weight(m.effective_weight(at)),
            m.uses,
            m.ok_count,
            m.error_count,
            short_utc(m.ts_last),
        )
        for m in edges
    ]
    headers = ("ID", "SOURCE", "DESTINATION", "STATE", "WEIGHT", "USES", "OK", "ERROR", "LAST")
    click.echo(table(headers, rows, {"WEIGHT", "USES", "OK", "ERROR"}))


def render_one(m: Mnest, as_json: bool) -> None:
    """Print the one mnest a command changed, weighted now."""
    now = utc_now()
    if as_json:
        echo_json(mnest_record(m, now))
    else:
        render_edges([m], now, False, "")


def render_walk(paths: Sequence[Sequence[Mnest]], at: datetime, as_json: bool) -> None:
    """Print the paths of a walk, best score first."""
    records: list[dict[str, Any]] = []
    for rank, path in enumerate(paths, 1):
        score = 1.0
        for m in path:
            score *= m.effective_weight(at)
        text = " -> ".join(
            [endpoint(path[0].src_executor, path[0].src_version)]
            + [endpoint(m.dst_executor, m.dst_version) for m in path]
        )
        records.append(
            {
                "rank": rank,
                "score": score,
                "depth": len(path),
                "path": text,
                "mnest_ids": [m.id for m in path],
                "edges": [mnest_record(m, at) for m in path],
            }
        )
    if as_json:
        echo_json(records)
    elif not records:
        click.echo("(no path)")
    else:
        rows = [(r["rank"], _fmt_weight(r["score"]), r["depth"], r["path"]) for r in records]
        click.echo(table(("RANK", "SCORE", "DEPTH", "PATH"), rows, {"RANK", "SCORE", "DEPTH"}))


def render_suggestions(
    suggestions: Sequence[tuple[Mnest, float]],
    at: datetime,
    as_json: bool,
    *,
    order_by: str = "weight",
) -> None:
    """Print what a planner would be told to try next, best first: the value it was ordered
    by (the effective weight as SCORE, or the decayed count of passings as COUNT) and the
    activation that breaks ties."""
    by_count = order_by == DECAYED_USES_ORDER
    records: list[dict[str, Any]] = [
        {
            "rank": i,
            **mnest_record(m, at, effective=None if by_count else v),
            "order_by": order_by,
            "score": v,
            "activation": activation(m.uses, m.ts_first, m.ts_last, at),
        }
        for i, (m, v) in enumerate(suggestions, 1)
    ]
    if as_json:
        echo_json(records)
        return
    if not suggestions:
        click.echo("(no suggestion)")
        return
    rows = [
        (
            r["rank"],
            endpoint(m.dst_executor, m.dst_version),
            f"{r['score']:.3f}" if by_count else _fmt_weight(r["score"]),
            f"{r['activation']:.3f}",
            m.uses,
            short_utc(m.ts_last),
            m.id,
        )
        for r, (m, _) in zip(records, suggestions, strict=True)
    ]
    value = "COUNT" if by_count else "SCORE"
    headers = ("RANK", "NEXT", value, "ACTIVATION", "USES", "LAST", "ID")
    click.echo(table(headers, rows, {"RANK", value, "ACTIVATION", "USES"}))


def render_forecast(
    forecast: Forecast, asked: Sequence[str], version: str | None, as_json: bool
) -> None:
    """Print what follows the last one or two executors ``asked`` (the last one at
    ``version``, when given): one row per candidate, most likely first, with P(next), the
    decayed count of passings to it and their number; then the probability left to the
    executors never seen after the context, and which context answered (the chain of the
    two, the last executor alone, or nothing seen after it)."""
    if as_json:
        echo_json(forecast.as_dict())
        return
    if forecast.candidates:
        rows = [
            (i, c.executor, f"{c.p:.3f}", f"{c.support:.3f}", c.uses)
            for i, c in enumerate(forecast.candidates, 1)
        ]
        headers = ("RANK", "NEXT", "P", "SUPPORT", "USES")
        click.echo(table(headers, rows, {"RANK", "P", "SUPPORT", "USES"}))
    else:
        click.echo("(no candidate)")
    click.echo("")
    hidden = 1.0 - forecast.unseen - sum(c.p for c in forecast.candidates)
    if hidden >= 5e-4:  # -k cut the list: what the candidates left out hold together
        n = len(forecast.candidates)
        click.echo(f"others   {hidden:.3f} (the candidates past the first {n}, together)")
    click.echo(
        f"unseen   {forecast.unseen:.3f} (every executor never seen after the context, together)"
    )
    last = endpoint(asked[-1], version)
    if forecast.used is ContextUsed.NONE:
        said = f"nothing seen after {last}"
    else:
        names = " -> ".join([*forecast.context[:-1], last])
        support = forecast.support  # two digits below 1: a faded count is not "0.0"
        count = f"{support:.1f}" if support >= 0.95 else f"{support:.2g}"
        said = f"{names} ({forecast.used.value}, {count} passings"
        if len(asked) == 2 and forecast.used is ContextUsed.EDGE:
            said += f"; {asked[0]} -> {asked[-1]} seen too rarely to answer"
        said += ")"
    click.echo(text_for_terminal(f"context  {said}"))


def render_verdict(verdict: Verdict, as_json: bool) -> None:
    """Print what the store knows of a proposed chain: one row per link, then the chain's
    score, weakest link and unknown links (unknown: never seen active, not wrong)."""
    if as_json:
        echo_json(verdict.as_dict())
        return
    rows = [
        (
            link.index,
            endpoint(link.src_executor, link.src_version),
            endpoint(link.dst_executor, link.dst_version),
            "yes" if link.known else "no",
            _fmt_weight(link.weight),
            link.uses,
            link.ok_count,
            link.error_count,
            f"{link.success:.3f}",
            short_utc(link.last_seen),
            state_word(link.state),
        )
        for link in verdict.links
    ]
    headers = (
        "LINK", "SOURCE", "DESTINATION", "KNOWN", "WEIGHT", "USES", "OK", "ERROR", "SUCCESS",
        "LAST SEEN", "STATE",
    )  # fmt: skip
    click.echo(table(headers, rows, {"LINK", "WEIGHT", "USES", "OK", "ERROR", "SUCCESS"}))
    click.echo("")
    click.echo(f"score    {verdict.score:.3f} (the product of the links' weights)")
    if verdict.weakest is not None:
        link = verdict.links[verdict.weakest]
        src = endpoint(link.src_executor, link.src_version)
        dst = endpoint(link.dst_executor, link.dst_version)
        click.echo(text_for_terminal(f"weakest  link {link.index}: {src} -> {dst}"))
    if verdict.unknown:
        n = len(verdict.unknown)
        click.echo(
            f"unknown  link{'s' if n != 1 else ''} {', '.join(map(str, verdict.unknown))}: "
            "no active edge seen, which is not evidence against " + ("them" if n != 1 else "it")
        )
    else:
        click.echo("unknown  none: every link has an active edge")


def render_protos(protos: Sequence[Mnest], at: datetime, as_json: bool) -> None:
    """Print proto-mnests: executors wished for that do not exist yet."""
    if as_json:
        echo_json([mnest_record(m, at) for m in protos])
        return
    if not protos:
        click.echo("(no recurring proto)")
        return
    rows = [
        (
            m.id,
            endpoint(m.src_executor, m.src_version),
            m.dst_executor,
            m.uses,
            _fmt_weight(m.effective_weight(at)),
            _summary(m),
        )
        for m in protos
    ]
    headers = ("ID", "SOURCE", "WISHED FOR", "USES", "WEIGHT", "SUMMARY")
    click.echo(table(headers, rows, {"USES", "WEIGHT"}))


def render_events(events: Sequence[Event], as_json: bool) -> None:
    """Print events, oldest first."""
    if as_json:
        echo_json([row_record(e) for e in events])
        return
    if not events:
        click.echo("(no event)")
        return
    rows = [
        (
            e.id,
            short_utc(e.ts),
            e.kind,
            e.mnest_id,
            e.turn_id,
            f"{_fmt_weight(e.weight_before)} -> {_fmt_weight(e.weight_after)}",
            f"{state_word(e.state_before) or '-'} -> {state_word(e.state_after) or '-'}",
        )
        for e in events
    ]
    headers = ("ID", "TS", "KIND", "MNEST", "TURN", "WEIGHT", "STATE")
    click.echo(table(headers, rows, {"ID"}))


def render_ager(report: AgerReport, at: datetime, dry_run: bool, as_json: bool) -> None:
    """Print what one run of the ager did, or would do."""
    data = {**asdict(report), "dry_run": dry_run, "at": iso_utc(at)}
    if as_json:
        echo_json(data)
        return
    head = "ager (dry run: nothing changed)" if dry_run else "ager"
    click.echo(f"{head} at {short_utc(at)}")
    for key in (f.name for f in fields(AgerReport)):
        click.echo(f"  {key:<19}{data[key]}")


def render_prune(
    events: int, before: datetime, dry_run: bool, as_json: bool, *, estimated: bool = False
) -> None:
    """Print how many events a prune deleted, or would delete; "about N" when the count is
    an estimate (``estimated``: months dropped whole, counted from the catalogue)."""
    if as_json:
        data = {"events": events, "before": iso_utc(before), "dry_run": dry_run}
        echo_json({**data, "estimated": estimated})
        return
    noun = "event" if events == 1 else "events"
    if dry_run:
        click.echo(
            f"would delete {events} {noun} before {short_utc(before)} (dry run: nothing deleted)"
        )
    else:
        count = f"about {events}" if estimated else str(events)
        click.echo(f"deleted {count} {noun} before {short_utc(before)}")


# What split-history says where events are one table.
NOTHING_TO_SPLIT_SQLITE = (
    "nothing to split: events are one table in this store (SQLite keeps no partitions); "
    "split-history rebuilds the partitions of a PostgreSQL store"
)


def render_split(report: SplitReport, as_json: bool) -> None:
    """Print what a split did, or with a dry run what waits to be split."""
    if as_json:
        echo_json(report.as_dict())
        return
    if not report.partitioned:
        click.echo(NOTHING_TO_SPLIT_SQLITE)
        return
    if report.dry_run:
        if not report.waiting:
            click.echo("nothing to split: every event of events is in a month of its own")
            return
        n = len(report.waiting)
        layout = "" if any(p.is_default for p in report.waiting) else " in the old layout"
        click.echo(
            f"would split {n} partition{'s' if n != 1 else ''} of events{layout} "
            "(dry run: nothing changed):"
        )
        for p in report.waiting:
            rows = "rows not analysed yet" if p.rows is None else f"about {p.rows} events"
            if p.is_default:
                click.echo(f"  {p.name}: the months no partition covers, {rows}")
                continue
            span = f"from {p.as_dict()['from']}" if p.lower is not None else "from the start"
            click.echo(f"  {p.name}: {span} to {p.as_dict()['to']}, {rows}")
        return
    if not report.partitions:
        click.echo("nothing to split: every event of events is in a month of its own")
        return
    n, m = len(report.partitions), len(report.months)
    click.echo(
        f"split {n} partition{'s' if n != 1 else ''} ({', '.join(report.partitions)}) into "
        f"{m} month{'s' if m != 1 else ''} ({min(report.months)} to {max(report.months)}): "
        f"{report.copied} rows copied in {report.batches} "
        f"batch{'es' if report.batches != 1 else ''}, those written meanwhile mirrored"
    )


def render_top_queries(rows: Sequence[QueryFrequency], as_json: bool) -> None:
    """Print the most frequent canonical queries, most frequent first."""
    if as_json:
        echo_json(
            [
                {
                    "canonical_query": r.canonical_query,
                    "canonical_hash": r.canonical_hash,
                    "count": r.count,
                    "last_ts": iso_utc(r.last_ts),
                }
                for r in rows
            ]
        )
    elif not rows:
        click.echo("(no query logged)")
    else:
        lines = [(r.count, short_utc(r.last_ts), r.canonical_query) for r in rows]
        click.echo(table(("COUNT", "LAST", "CANONICAL QUERY"), lines, {"COUNT"}))


def render_recent_queries(rows: Sequence[CanonicalQuery], as_json: bool) -> None:
    """Print the latest entries of the canonical query log."""
    if as_json:
        echo_json([row_record(r) for r in rows])
    elif not rows:
        click.echo("(no query logged)")
    else:
        lines = [(r.id, short_utc(r.ts), r.turn_id, r.canonical_query, r.raw_query) for r in rows]
        click.echo(table(("ID", "TS", "TURN", "CANONICAL", "RAW"), lines, {"ID"}))


def render_copy(report: CopyReport, as_json: bool) -> None:
    """Print what a copy did: rows per table, where from and to, what it merged."""
    if as_json:
        echo_json({**asdict(report), "verified": True})
        return
    counts = ", ".join(
        counted(n, *COPY_LABELS.get(name, (name, name))) for name, n in report.rows.items()
    )
    click.echo(f"copied {counts}")
    click.echo(f"  from {report.source}")
    click.echo(f"  to   {report.target}")
    if report.appended:
        click.echo(
            f"merged {counted(report.merged, 'edge', 'edges')} that both stores held "
            f"({counted(report.turns_counted_once, 'turn', 'turns')} counted once)"
        )
    click.echo("verified: row counts and content checksums match")


# --- output files ---------------------------------------------------------------------------

# Why a write failed, in plain words (else the system's own, in lower case).
_WRITE_FAILURES = {
    errno.ENOENT: "no such directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "it is a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
}


def check_output_path(path: str, store_files: Sequence[str] = ()) -> Path:
    """The file that ``-o`` names, if one can be written there and it is none of
    ``store_files`` (the store's database, journals and lock files, by path or by link);
    else bad input (exit 2), said in plain words before the store is read, nothing written."""
    target = Path(path)
    parent = target.parent
    nearest = parent
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise InvalidInput(f"cannot write {path}: {nearest} is not a directory")
    if nearest != parent:
        raise InvalidInput(f"cannot write {path}: no such directory {parent}")
    if target.is_dir():
        raise InvalidInput(f"cannot write {path}: it is a directory")
    taken = _store_file(target, store_files)
    if taken is not None:
        raise InvalidInput(
            f"cannot write {path}: that is {taken}, a file of the store being read "
            "(writing it would destroy the store); give another file"
        )
    if _in_place(target):
        writable = os.access(target, os.W_OK)
    else:
        folder = Path(os.path.realpath(target)).parent
        writable = os.access(folder, os.W_OK)
        if not writable and target.exists() and os.access(target, os.W_OK):
            raise InvalidInput(
                f"cannot write {path}: its directory {folder} is not writable (the file "
                "is written beside it, then renamed over it)"
            )
    if not writable:
        raise InvalidInput(f"cannot write {path}: permission denied")
    return target


def _store_file(target: Path, files: Sequence[str]) -> str | None:
    """The one of ``files`` that ``target`` is: the same path once links are followed, or
    the same file under another name (a hard link); None when it is none of them."""
    real = os.path.realpath(target)
    try:
        here = os.stat(target)
    except OSError:
        here = None
    for name in files:
        if os.path.realpath(name) == real:
            return name
        if here is None:
            continue
        try:
            there = os.stat(name)
        except OSError:
            continue
        if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
            return name
    return None


def _in_place(target: Path) -> bool:
    """True for a target that is written in place, not replaced: a device or a FIFO
    (``/dev/stdout``, a pipe a reader waits on)."""
    return target.exists() and not target.is_file()


def write_output(target: Path, text: str) -> int:
    """Write ``text`` to ``target`` whole or not at all: into a new file in the same
    directory, renamed over it once complete (through a link, over the file it leads to),
    so that a failed write leaves the file as it was; a device or a FIFO is written in
    place. A failure (a full disk, ...) is one line, exit status 1. Returns the bytes
    written."""
    data = text.encode("utf-8")
    try:
        if _in_place(target):
            with open(target, "wb") as out:
                out.write(data)
        else:
            _replace_whole(Path(os.path.realpath(target)), data)
    except OSError as err:
        why = _WRITE_FAILURES.get(err.errno or 0) or (err.strerror or type(err).__name__).lower()
        raise CliFailure(f"cannot write {target}: {why}") from None
    return len(data)


def _replace_whole(path: Path, data: bytes) -> None:
    """``data`` into a new file beside ``path`` (an existing file's mode kept), flushed to
    the disk, then renamed over ``path``; the new file is removed if any step fails."""
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    partial = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(partial, flags, 0o666 if mode is None else mode)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # as it was, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, path)
    except BaseException:
        with suppress(OSError):
            partial.unlink()
        raise


def megabytes(size: int) -> str:
    """A size in bytes as people read it: ``44.1 MB``, ``512 kB``, ``80 bytes``."""
    if size >= 1_000_000:
        return f"{size / 1_000_000:.1f} MB"
    if size >= 1_000:
        return f"{size / 1_000:.0f} kB"
    return f"{size} bytes"


def render_store(url: URL) -> None:
    """Once a command that opened a store is done, which store it was (the URL, its secrets
    hidden) on stderr when a person reads it (a terminal), so that a default store or a
    variable never goes unseen; stdout stays the table or the JSON, and a log, a pipe or
    cron (which mails whatever a job writes) gets no extra line."""
    if stderr_is_terminal():
        click.echo(f"store: {redact_url(url)}", err=True)


def render_graph_report(
    nodes: int, edges: int, size: int, fmt: str, target: Path | None, large: int
) -> None:
    """On stderr: what ``graph -o FILE`` wrote, and a note when the picture is larger than
    ``large`` bytes (written or printed), which viewers may not open."""
    if target is not None:
        click.echo(
            f"wrote {target}: {edges:,} edge{'s' if edges != 1 else ''} between {nodes:,} "
            f"node{'s' if nodes != 1 else ''}, {megabytes(size)} of {fmt}",
            err=True,
        )
    if size > large:
        click.echo(
            f"note: this graph is {megabytes(size)} ({edges:,} edges), past "
            f"{megabytes(large)}: viewers may not open it; draw less with SRC and --depth, "
            "or --states",
            err=True,
        )
