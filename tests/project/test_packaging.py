"""The migrations ship inside the wheel, and `alembic` works from a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import REPO

import mnestoma

ROOT = REPO


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MNESTOMA_", "METNOS_"))}
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow
def test_an_installed_wheel_migrates_a_new_database_from_another_folder(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)],
        cwd=tmp_path,
    )  # fmt: skip
    [wheel] = list(wheels.glob("mnestoma-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bindir = env_dir / "bin"
    _run([str(bindir / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env()
    where = _run(
        [str(bindir / "python"), "-c",
         "import mnestoma.migration as m; print(m.migrations_path())"],
        cwd=elsewhere, env=env,
    ).strip()  # fmt: skip
    assert where.startswith(str(env_dir)), where
    assert where.endswith(os.path.join("mnestoma", "migrations"))

    url = f"sqlite:///{elsewhere / 'store.sqlite'}"
    _run([str(bindir / "mnestoma"), "db", "upgrade", "--database-url", url], cwd=elsewhere, env=env)
    current = _run(
        [str(bindir / "mnestoma"), "db", "current", "--database-url", url], cwd=elsewhere, env=env
    )
    assert f"{mnestoma.head_revision()} (head)" in current


def test_alembic_upgrade_head_works_from_the_repository_root(tmp_path: Path) -> None:
    env = _clean_env()
    env["MNESTOMA_DATABASE_URL"] = f"sqlite:///{tmp_path / 'dba.sqlite'}"
    _run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT, env=env)
    out = _run([sys.executable, "-m", "alembic", "current"], cwd=ROOT, env=env)
    assert f"{mnestoma.head_revision()} (head)" in out


def test_alembic_from_a_checkout_naming_no_database_refuses_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """Without ``-x database_url``, ``sqlalchemy.url`` or a variable naming the store,
    ``alembic`` would build ``./.mnestoma`` inside the checkout: it says what to give."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "alembic.ini").write_bytes((ROOT / "alembic.ini").read_bytes())
    (checkout / "migrations").symlink_to(ROOT / "migrations")
    env = _clean_env()
    env["PYTHONPATH"] = str(ROOT)
    for args in (["upgrade", "head"], ["current"]):
        done = subprocess.run(
            [sys.executable, "-m", "alembic", *args],
            cwd=checkout, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode != 0, done.stdout
        assert "FAILED: no database named: run `alembic -x database_url=URL" in done.stdout
        assert "Traceback" not in done.stdout + done.stderr
    assert not (checkout / ".mnestoma").exists()


def test_alembic_takes_a_url_with_x_database_url(tmp_path: Path) -> None:
    env = _clean_env()
    url = f"sqlite:///{tmp_path / 'x.sqlite'}"
    _run(
        [sys.executable, "-m", "alembic", "-x", f"database_url={url}", "upgrade", "0001"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    out = _run(
        [sys.executable, "-m", "alembic", "-x", f"database_url={url}", "current"], cwd=ROOT, env=env
    )
    assert out.split()[0] == "0001"
