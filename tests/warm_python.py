"""``run_python_warm``: code run as ``python -c`` would run it, in a process forked from an
interpreter that has already imported the package.

The guides' examples run twice each, about 150 interpreters a suite, and each spent most of
its second of CPU importing SQLAlchemy, Alembic and the package before the example's first
line. Here one interpreter per test process (the *zygote*) imports them once and forks a
child per run. The child is a new process: its own cwd, environment, ``__main__``, standard
streams (files the caller reads), modules imported by the example; it ends as an interpreter
ends (non-daemon threads joined, then the ``atexit`` functions, streams flushed). The zygote
holds no thread, engine or connection when it forks.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["run_python_warm"]

# The zygote: imports, then forks one child per request line and reports its pid, then its
# exit status. The child's body is ``_child`` below, sent as source (the zygote is ``-c``).
_CHILD = r"""
def _child(req):
    import atexit, io, tempfile, threading, traceback, types
    status = 0
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        tempfile.tempdir = None  # found again from TMPDIR, as a new interpreter would
        sys.argv = ["-c"]
        sys.path[0] = ""  # as for -c: the working folder first
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(req["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        code = stop.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    try:  # as an interpreter ends
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status & 0xFF)
"""
_ZYGOTE = (
    "import json, os, sys\n"
    "import sqlalchemy.orm, alembic.command, mnestoma, mnestoma.cli\n"
    + _CHILD
    + r"""
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        _child(req)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
"""
)

_lock = threading.Lock()
_zygote: list[subprocess.Popen[str]] = []


def _started() -> subprocess.Popen[str]:
    """This process's zygote, started on first use (and again if it died)."""
    if _zygote and _zygote[0].poll() is None:
        return _zygote[0]
    proc = subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _zygote[:] = [proc]
    return proc


@atexit.register
def _stop() -> None:
    for proc in _zygote:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)


def run_python_warm(
    code: str, cwd: Path | str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``code`` run as by ``python -c`` in a new process (in ``cwd``, with this process's
    environment as it is now), its output captured as text; the caller judges the exit
    code. On ``timeout`` the child is killed and ``subprocess.TimeoutExpired`` raised."""
    args = [sys.executable, "-c", code]
    with _lock, tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        request = {
            "code": code,
            "cwd": str(Path(cwd or os.getcwd()).resolve()),
            "env": dict(os.environ),
            "stdout": str(out),
            "stderr": str(err),
        }
        zygote = _started()
        assert zygote.stdin is not None and zygote.stdout is not None
        zygote.stdin.write(json.dumps(request) + "\n")
        zygote.stdin.flush()
        pid = json.loads(zygote.stdout.readline())["pid"]
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            os.kill(pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            answer = zygote.stdout.readline()
        finally:
            timer.cancel()
        if not answer:
            raise RuntimeError(f"the warm interpreter ended (exit {zygote.wait()})")
        status = json.loads(answer)["status"]
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if killed.is_set():
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
        return subprocess.CompletedProcess(args, status, stdout, stderr)
