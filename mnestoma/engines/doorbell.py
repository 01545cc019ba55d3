"""The doorbell of a SQLite store: a maintenance run (the ager, a prune) tells the writes that
wait for the write lock that it lets the lock go.

A write of this package that finds the lock taken sleeps between its tries, 10 ms once it
says that it waits (:data:`~mnestoma.rules.WRITE_LOCK_POLL_S`): few wake-ups keep the holder
running when many writers queue for one edge. Behind a maintenance run, though, each would
take up to those 10 ms to notice that the run's batch has ended. So the write sleeps on
``<file>-writers.bell``, a FIFO (named pipe) beside the store, and the run rings it: it
leaves a byte in it from the moment its batch commits until its pause between two batches
ends (SQLite's checkpoint, which a commit may run, and the pause), and takes the byte back
then. While the bell holds a byte it wakes every sleeper, and a write that finds it rung
tries every :data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S`, as it did before the bell.
A ring that each write took for itself would wake one of them only: under several
writers, the others slept through the batch's checkpoint (measured: see the performance
guide).

The bell is only a hint; SQLite's lock stays the only lock:
- a byte left by a run that died costs the writes their long sleeps (they try every
  millisecond), until the next run's batch takes the lock and empties the bell;
- without a bell (no FIFOs on the system, a folder the process cannot write in, something
  else in its place) a write tries every :data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S`,
  short enough for the run's pauses, as a write that cannot say it waits does;
- writes that end do not ring: under eight writers on one edge, each waiter woken as the
  lock was let go handed it from process to process at every call (tried: see the
  performance guide).
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import threading

__all__ = ["Doorbell", "doorbell"]

# Bytes read at once when hushing: Linux's default pipe holds 64 KiB.
_DRAIN_BYTES = 1 << 16
_OPEN_FLAGS = (
    os.O_RDWR  # a FIFO opened for both ends never waits for a peer (Linux)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class Doorbell:
    """This process's end of a store's bell (a descriptor of the FIFO, read and written
    without waiting)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def ring(self) -> None:
        """Wake the writes that sleep on the bell, and keep it rung until :meth:`hush`: one
        byte, unless it holds one already (none when the pipe is full, which rings it too)."""
        if not self.rung():
            with contextlib.suppress(OSError):
                os.write(self.fd, b"\0")

    def hush(self) -> None:
        """Take every byte out: the bell no longer rings (its ringer's batch holds the lock,
        or its pause is over)."""
        with contextlib.suppress(OSError):
            while len(os.read(self.fd, _DRAIN_BYTES)) == _DRAIN_BYTES:
                pass

    def rung(self) -> bool:
        """Whether the bell holds a byte: a maintenance run lets the write lock go."""
        return bool(self._poller(0))

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` at most, waking when the bell rings (at once if it is rung)."""
        with contextlib.suppress(InterruptedError):
            self._poller(max(0.0, seconds) * 1000.0)

    def _poller(self, ms: float) -> list[tuple[int, int]]:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return poller.poll(ms)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# This process's bells, by the FIFO's path (None: that path cannot be a bell).
_BELLS: dict[str, Doorbell | None] = {}
_OPENING = threading.Lock()


def doorbell(path: str | None, *, create: bool = True) -> Doorbell | None:
    """This process's bell at ``path`` (the FIFO made if missing), or None: no path (an
    in-memory database), no FIFOs on this system (nor ``select.poll``), or a file there
    that is not a FIFO this user can read and write. Without ``create``, None as well
    while no FIFO is there: no write has ever slept on it, so there is nobody to wake (a
    maintenance batch's commit asks so, and leaves no file beside a store nobody waits
    for)."""
    if path is None:
        return None
    try:
        return _BELLS[path]
    except KeyError:
        pass
    if not create and not os.path.lexists(path):
        return None
    with _OPENING:
        if path not in _BELLS:
            _BELLS[path] = _open(path)
        return _BELLS[path]


def _open(path: str) -> Doorbell | None:
    mkfifo = getattr(os, "mkfifo", None)
    if mkfifo is None or not hasattr(select, "poll"):
        return None
    try:
        mkfifo(path, 0o666)  # the umask applies, as to the lock files beside it
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            return Doorbell(fd)
    except OSError:
        pass
    os.close(fd)
    return None


def _forget_in_child() -> None:
    """A forked child opens its bells again (the parent's descriptors are the parent's)."""
    global _OPENING
    for bell in _BELLS.values():
        if bell is not None:
            bell.close()
    _BELLS.clear()
    _OPENING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
