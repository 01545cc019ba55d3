"""``run_python_warm``: code run as ``python -c`` would run it, in a process forked from an
interpreter that has already imported the package.

The guides' examples run twice each, and each run spent most of its second of CPU importing
SQLAlchemy, Alembic and the package before the example's first line. Here an interpreter
of the test process (a *zygote*) runs ``import mnestoma``, the one import of a new
interpreter that runs an example, and nothing more, then forks a child per run. The child
is a new process: its own folder, environment, ``__main__``, standard streams (files the
caller reads), and the modules the example imports; it ends as an interpreter ends
(non-daemon threads and their exit hooks, then the ``atexit`` functions, then the
example's objects finalized and the streams flushed). The zygote holds no thread, engine
or connection when it forks. Each ``zygote`` number is an interpreter of its own, with its
own string hashing: two runs of one example on two of them are not hashed alike, as two
new interpreters are not.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

__all__ = ["ZYGOTE_IMPORTS", "run_cli_warm", "run_python_warm"]

# What a zygote imports before it forks: what a new interpreter that runs a guide's
# example imports first (tests/project/test_warm_python.py checks that the two agree).
ZYGOTE_IMPORTS = "import mnestoma"

# The zygote: imports, then forks one child per request line and reports its pid, then its
# exit status. The child's body is ``_child`` below, sent as source (the zygote is ``-c``).
_CHILD = r"""
def _child(req):
    import atexit, gc, tempfile, threading, types
    status = 0
    main = None
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        # the interpreter's own streams, on the descriptors just replaced (empty: the
        # zygote flushes every line it writes)
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
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
    except BaseException as err:  # reported as the interpreter reports it, from <string>
        tb = err.__traceback__.tb_next if err.__traceback__ is not None else None
        sys.excepthook(type(err), err, tb)
        status = 1
    try:  # as an interpreter ends
        threading._shutdown()  # non-daemon threads joined, their exit hooks run
        atexit._run_exitfuncs()
        if main is not None:
            main.__dict__.clear()  # the example's objects finalized: files flushed, __del__
        gc.collect()
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
    finally:
        os._exit(status & 0xFF)
"""
_ZYGOTE = (
    "import json, os, sys\n"
    + ZYGOTE_IMPORTS
    + "\n"
    + _CHILD
    + r"""
import gc
gc.freeze()  # what the zygote holds is never collected again by a child (copy-on-write kept)
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
_zygotes: dict[int, tuple[subprocess.Popen[str], IO[bytes]]] = {}


def _started(number: int) -> subprocess.Popen[str]:
    """Zygote ``number`` of this process, started on first use (and again if it ended)."""
    if number in _zygotes and _zygotes[number][0].poll() is None:
        return _zygotes[number][0]
    _dropped(number)
    # its own stderr, open while it lives, read when it ends unexpectedly
    errors = tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    _zygotes[number] = (proc, errors)
    return proc


def _dropped(number: int, *, kill: bool = False) -> str:
    """Stop zygote ``number`` (ended by closing its input, else killed); what it wrote to
    its stderr."""
    if number not in _zygotes:
        return ""
    proc, errors = _zygotes.pop(number)
    if kill:
        proc.kill()
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    errors.seek(0)
    said = errors.read().decode(errors="replace")
    errors.close()
    return said


@atexit.register
def _stop() -> None:
    for number in list(_zygotes):
        _dropped(number)


def run_python_warm(
    code: str,
    cwd: Path | str | None = None,
    timeout: float = 120,
    *,
    zygote: int = 0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``code`` run as by ``python -c`` in a new process (in ``cwd``, with ``env`` or this
    process's environment as it is now), forked from zygote number ``zygote``; its output
    captured as text; the caller judges the exit code. On ``timeout`` the child is killed
    and ``subprocess.TimeoutExpired`` raised. (``PYTHONPATH`` in ``env`` moves no import:
    the zygote's path was set when it started.)"""
    args = [sys.executable, "-c", code]
    with _lock, tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        request = {
            "code": code,
            "cwd": str(Path(cwd or os.getcwd()).resolve()),
            "env": dict(os.environ if env is None else env),
            "stdout": str(out),
            "stderr": str(err),
        }
        proc = _started(zygote)
        assert proc.stdin is not None and proc.stdout is not None
        killed = threading.Event()
        pid = None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            started = proc.stdout.readline()
            if not started:
                said = _dropped(zygote)
                raise RuntimeError(f"the warm interpreter ended before the run:\n{said}")
            pid = json.loads(started)["pid"]

            def kill() -> None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # it ended meanwhile: no timeout
                    return
                killed.set()

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                answer = proc.stdout.readline()
            finally:
                timer.cancel()
            if not answer:
                said = _dropped(zygote)
                raise RuntimeError(f"the warm interpreter ended during the run:\n{said}")
            status = json.loads(answer)["status"]
        except BaseException:
            # whatever stopped the call (an interrupt among them): the child and its zygote
            # go, so that no answer of this run is read as the next run's
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _dropped(zygote, kill=True)
            raise
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if killed.is_set():
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
        return subprocess.CompletedProcess(args, status, stdout, stderr)


def run_cli_warm(
    *args: str,
    cwd: Path | str | None = None,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m mnestoma ARGS`` as :func:`run_python_warm` runs code: the package's
    ``__main__`` run as ``-m`` runs it (``sys.argv[0]`` its file)."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['-m', *{list(args)!r}]\n"
        "runpy.run_module('mnestoma', run_name='__main__', alter_sys=True)\n"
    )
    done = run_python_warm(code, cwd, timeout, env=env)
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "mnestoma", *args], done.returncode, done.stdout, done.stderr
    )
