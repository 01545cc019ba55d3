"""Progress on stderr, never on stdout: a spinner while a long step runs (on a terminal
only), a bar while a big copy runs."""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

__all__ = [
    "PROGRESS_THRESHOLD",
    "SPINNER_DELAY_S",
    "batch_progress",
    "partition_progress",
    "progress_bar",
    "spinner",
    "stderr_is_terminal",
]

PROGRESS_THRESHOLD = 10_000  # rows: a smaller copy shows no bar
SPINNER_DELAY_S = 0.5  # a quick run shows nothing; a long one (a big store) a spinner
SPINNER_INTERVAL_S = 0.1


def stderr_is_terminal() -> bool:
    """True when stderr is a terminal: a person reads it, not a log, a pipe or cron (which
    mails whatever a job writes)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _stderr_is_terminal() -> bool:
    """True when stderr is a terminal (progress is for people, never for logs or pipes)."""
    return stderr_is_terminal()


@contextlib.contextmanager
def spinner(label: str) -> Iterator[Callable[[], None]]:
    """While the block runs, a spinner and the elapsed seconds on stderr, on a terminal only.

    Nothing is drawn before ``SPINNER_DELAY_S`` (0: at once); the line is cleared at the end,
    or earlier by the callable it yields (a step that goes on to draw its own progress).
    """
    if not _stderr_is_terminal():
        yield lambda: None
        return
    done = threading.Event()
    start = time.monotonic()
    frames = itertools.cycle("|/-\\")
    width = 0  # of the line drawn last, to blank it at the end
    drawing = threading.Lock()

    def draw() -> None:
        nonlocal width
        line = f"{next(frames)} {label}  {time.monotonic() - start:.1f} s"
        click.echo(f"\r{line}", nl=False, err=True)
        width = max(width, len(line))

    def spin() -> None:
        if done.wait(SPINNER_DELAY_S):
            return
        while True:
            with drawing:
                if done.is_set():
                    return
                draw()
            done.wait(SPINNER_INTERVAL_S)

    def stop() -> None:
        nonlocal width
        with drawing:
            done.set()
            if width:
                click.echo("\r" + " " * width + "\r", nl=False, err=True)
                width = 0

    if SPINNER_DELAY_S <= 0:
        draw()
    thread = threading.Thread(target=spin, name="mnestoma-spinner", daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop()
        thread.join()


@contextlib.contextmanager
def progress_bar(total: int) -> Iterator[Callable[[int], Any]]:
    """A bar of ``total`` rows on stderr, above ``PROGRESS_THRESHOLD`` rows; the callable
    it yields advances it."""
    if total <= PROGRESS_THRESHOLD:
        yield lambda n: None
        return
    with click.progressbar(length=total, label="copying rows", file=sys.stderr) as bar:
        yield bar.update


@contextlib.contextmanager
def batch_progress(label: str, counted: str | None = None) -> Iterator[Callable[..., None]]:
    """A line ``label: batch 12/250 (4.8 s)`` on stderr, redrawn after each batch, on a
    terminal only; the callable it yields takes (batches done, batches in all) and, with
    ``counted``, what they came to so far (``prune: batch 12/250, 60,000 events deleted``).
    The line is cleared at the end."""
    if not _stderr_is_terminal():
        yield lambda done, total, count=None: None
        return
    start = time.monotonic()
    width = 0

    def draw(done: int, total: int, count: int | None = None) -> None:
        nonlocal width
        so_far = f", {count:,} {counted}" if counted is not None and count is not None else ""
        line = f"{label}: batch {done}/{total}{so_far} ({time.monotonic() - start:.1f} s)"
        click.echo(f"\r{line.ljust(width)}", nl=False, err=True)
        width = max(width, len(line))

    try:
        yield draw
    finally:
        if width:
            click.echo("\r" + " " * width + "\r", nl=False, err=True)


@contextlib.contextmanager
def partition_progress(label: str, counted: str) -> Iterator[Callable[[str, int, int, int], None]]:
    """:func:`batch_progress` for a run over partitions, one after the other: the callable it
    yields takes (partition, batches done, batches in all, what they came to so far) and
    draws ``label PARTITION: batch 3/40, 15,000 rows copied (1.2 s)``, a line a partition."""
    current: tuple[str, contextlib.ExitStack, Callable[..., None]] | None = None

    def draw(partition: str, done: int, total: int, count: int) -> None:
        nonlocal current
        if current is None or current[0] != partition:
            if current is not None:
                current[1].close()
            stack = contextlib.ExitStack()
            line = stack.enter_context(batch_progress(f"{label} {partition}", counted))
            current = (partition, stack, line)
        current[2](done, total, count)

    try:
        yield draw
    finally:
        if current is not None:
            current[1].close()
