"""The warm interpreter the guides' examples run in behaves as ``python -c`` does, for what
an example can see: its exit status, its streams, its folder and environment, ``__main__``,
threads and ``atexit`` at its end, and nothing left over from the run before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers_proc import run_python
from warm_python import ZYGOTE_IMPORTS, run_cli_warm, run_python_warm

SNIPPETS = {
    "prints and ends": "import os, sys\nprint(__name__, os.getcwd(), sys.argv, os.environ['W'])"
    "\nprint('to stderr', file=sys.stderr)",
    "raises": "raise ValueError('an example that fails')",
    "exits with a status": "import sys\nsys.exit(3)",
    "exits with a message": "import sys\nsys.exit('a message')",
    "ends its threads and atexit": "import atexit, threading, time\n"
    "atexit.register(lambda: print('atexit ran'))\n"
    "threading.Thread(target=lambda: (time.sleep(0.2), print('thread ended'))).start()",
    "uses the package": "import mnestoma\nm = mnestoma.Mnestoma('sqlite:///w.db')\n"
    "print(m.record_passing('a', '1', 'b', '1').uses)\nm.close()",
    "finds its temporary folder": "import tempfile\nprint(tempfile.gettempdir())",
    "leaves an executor open": "from concurrent.futures import ThreadPoolExecutor\n"
    "pool = ThreadPoolExecutor(1)\nprint(pool.submit(lambda: 2).result())",
    "leaves a file open and an object to finalize": "class Noisy:\n"
    "    def __del__(self):\n        print('finalized')\n"
    "kept = Noisy()\nleft = open('left.txt', 'w')\nleft.write('written at the end')",
    "reports its own errors": "import sys\n"
    "sys.excepthook = lambda *args: print('its own hook', file=sys.stderr)\nraise KeyError(1)",
}


@pytest.mark.parametrize("code", SNIPPETS.values(), ids=SNIPPETS.keys())
def test_the_warm_interpreter_runs_code_as_python_c_does(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("W", "set by the test")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    cold_dir, warm_dir = tmp_path / "cold", tmp_path / "warm"
    cold_dir.mkdir()
    warm_dir.mkdir()
    cold, warm = run_python(code, cwd=cold_dir), run_python_warm(code, cwd=warm_dir)
    assert warm.returncode == cold.returncode
    assert warm.stdout.replace("warm", "cold") == cold.stdout.replace("warm", "cold")
    assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:]
    left = [(d / "left.txt").read_text() for d in (cold_dir, warm_dir) if (d / "left.txt").exists()]
    assert left in ([], ["written at the end"] * 2)


def test_a_zygote_holds_what_a_new_interpreter_running_an_example_holds(tmp_path: Path) -> None:
    """The zygote imports no more than an example's first line does: a module the example
    never imported is missing for it, as it is for a reader."""
    shown = "import sys\nprint(*sorted(m for m in sys.modules if m.startswith('mnestoma')))"
    cold = run_python(f"{ZYGOTE_IMPORTS}\n{shown}", cwd=tmp_path)
    warm = run_python_warm(shown, tmp_path)
    assert cold.returncode == warm.returncode == 0, cold.stderr + warm.stderr
    assert warm.stdout.split() == cold.stdout.split()
    assert "mnestoma" in warm.stdout.split()


def test_two_zygotes_hash_strings_as_two_new_interpreters_do(tmp_path: Path) -> None:
    code = "print(hash('mnestoma'))"
    cold = {run_python(code, cwd=tmp_path).stdout for _ in range(2)}
    warm = {run_python_warm(code, tmp_path, zygote=z).stdout for z in range(2)}
    assert len(warm) == len(cold)


def test_a_warm_run_starts_without_what_the_run_before_imported_or_set(tmp_path: Path) -> None:
    first = run_python_warm("import json, os\njson.left = 1\nos.environ['LEFT'] = '1'", tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_python_warm(
        "import json, os\nprint(hasattr(json, 'left'), 'LEFT' in os.environ)", tmp_path
    )
    assert second.stdout.split() == ["False", "False"]


def test_a_warm_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python_warm("import time\ntime.sleep(30)", tmp_path, timeout=0.5)
    assert run_python_warm("print('next')", tmp_path).stdout == "next\n"


@pytest.mark.parametrize(
    "args",
    [("--version",), ("record",), ("edges", "--database-url", "sqlite:///missing/store.db")],
    ids=["version", "usage error", "no store"],
)
def test_the_warm_command_line_runs_as_python_m_mnestoma_does(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    cold = subprocess.run(
        [sys.executable, "-m", "mnestoma", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    warm = run_cli_warm(*args, cwd=tmp_path)
    assert warm.returncode == cold.returncode
    assert (warm.stdout, warm.stderr) == (cold.stdout, cold.stderr)
    assert cold.returncode != 0 or cold.stdout
