"""The README's Python examples run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_example_runs(index: int, tmp_path: Path) -> None:
    if "def test_" in BLOCKS[index]:
        # an example test: run it as a downstream suite with the one-line set-up
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["mnestoma.testing"]\n')
        (tmp_path / "test_example.py").write_text(BLOCKS[index])
        env = {k: v for k, v in os.environ.items() if not k.startswith("MNESTOMA_")}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 passed" in done.stdout
        return
    done = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    if "print(edge.uses" in BLOCKS[index]:
        assert done.stdout.split() == ["2", "0.4446"]
