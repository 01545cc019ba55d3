"""The wheel: it ships the migrations and the ``py.typed`` marker, and installed in a fresh
virtual environment it migrates a store and gives a downstream ``mypy`` its types;
``alembic`` works from a checkout."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
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
    env.pop("MYPYPATH", None)
    return env


@dataclass(frozen=True)
class Installed:
    """The wheel built from the checkout, and the virtual environment it is installed in."""

    wheel: Path
    env_dir: Path

    @property
    def bindir(self) -> Path:
        return self.env_dir / "bin"

    @property
    def python(self) -> Path:
        return self.bindir / "python"


def _build_and_install(into: Path) -> Installed:
    wheels = into / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)],
        cwd=into,
    )  # fmt: skip
    [wheel] = list(wheels.glob("mnestoma-*.whl"))
    env_dir = into / "venv"
    venv.create(env_dir, with_pip=True)
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=into)
    return Installed(wheel, env_dir)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The checkout's wheel installed in a fresh virtual environment, built once per run:
    the pytest-xdist workers share it (the first to come builds it under a file lock, the
    others wait for it), since a build and an install take the better part of a minute."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    place = base / "installed-wheel"
    with open(base / "installed-wheel.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = place / "ready"
        if not ready.exists():
            shutil.rmtree(place, ignore_errors=True)  # a build that failed half-way
            place.mkdir()
            installed = _build_and_install(place)
            ready.write_text(f"{installed.wheel}\n{installed.env_dir}\n", encoding="utf-8")
        wheel, env_dir = ready.read_text(encoding="utf-8").splitlines()
    return Installed(Path(wheel), Path(env_dir))


@pytest.mark.slow
def test_an_installed_wheel_migrates_a_new_database_from_another_folder(
    tmp_path: Path, installed_wheel: Installed
) -> None:
    bindir, env_dir = installed_wheel.bindir, installed_wheel.env_dir
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


@pytest.mark.slow
def test_the_installed_wheel_carries_the_package_s_version(
    tmp_path: Path, installed_wheel: Installed
) -> None:
    """The distribution's metadata and ``__version__`` agree once installed from the
    wheel, and are the checkout's (one source: ``__version__``, read by hatchling)."""
    got = _run(
        [str(installed_wheel.python), "-c",
         "import importlib.metadata as m, mnestoma;"
         " print(m.version('mnestoma'), mnestoma.__version__, mnestoma.__file__)"],
        cwd=tmp_path, env=_clean_env(),
    ).split()  # fmt: skip
    assert got[:2] == [mnestoma.__version__] * 2
    assert got[2].startswith(str(installed_wheel.env_dir)), got
    assert installed_wheel.wheel.name.startswith(f"mnestoma-{mnestoma.__version__}-")


# A downstream project's code: strict mypy passes on it only if it sees mnestoma's types
# (without them every name of the package is Any, and strict mypy reports the Any that
# each function returns).
DOWNSTREAM = '''"""A service that records a passing and reads what comes next."""

from __future__ import annotations

import mnestoma


def record(url: str) -> float:
    with mnestoma.Mnestoma(url) as store:
        edge = store.record_passing("plan", "1", "search", "1")
        return edge.weight


def next_steps(url: str) -> list[tuple[str, float]]:
    with mnestoma.Mnestoma(url) as store:
        return [(edge.dst_executor, score) for edge, score in store.suggest_next("plan")]
'''
# The same service with a type error that only the package's annotations reveal.
DOWNSTREAM_WRONG = DOWNSTREAM.replace(
    "        return edge.weight\n", "        label: str = edge.weight\n        return len(label)\n"
)
WRONG_LINE = DOWNSTREAM_WRONG.splitlines().index("        label: str = edge.weight") + 1


@pytest.mark.slow
def test_strict_mypy_on_a_downstream_project_reads_the_installed_wheel_s_types(
    tmp_path: Path, installed_wheel: Installed
) -> None:
    """The wheel ships ``mnestoma/py.typed`` (PEP 561): ``mypy --strict`` run for another
    project, whose environment holds the wheel and not this checkout, checks that project's
    calls against the package's annotations. Without the marker it reported "module is
    installed, but missing library stubs or py.typed marker"."""
    with zipfile.ZipFile(installed_wheel.wheel) as wheel:
        assert "mnestoma/py.typed" in wheel.namelist()
    project = tmp_path / "service"
    project.mkdir()
    (project / "service.py").write_text(DOWNSTREAM, encoding="utf-8")
    (project / "wrong.py").write_text(DOWNSTREAM_WRONG, encoding="utf-8")

    def mypy(module: str) -> subprocess.CompletedProcess[str]:
        # No configuration file and no MYPYPATH: mnestoma is found only where the fresh
        # environment's interpreter finds it, as an installed distribution.
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--config-file", "",
             "--python-executable", str(installed_wheel.python),
             "--cache-dir", str(tmp_path / "mypy-cache"), module],
            cwd=project, env=_clean_env(), capture_output=True, text=True, timeout=600,
            check=False,
        )  # fmt: skip

    good = mypy("service.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip() == "Success: no issues found in 1 source file"
    wrong = mypy("wrong.py")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert wrong.stdout.splitlines()[:-1] == [
        f"wrong.py:{WRONG_LINE}: error: Incompatible types in assignment (expression has type"
        ' "float", variable has type "str")  [assignment]'
    ], wrong.stdout


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
