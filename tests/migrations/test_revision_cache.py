"""The head revision is read from the scripts once per state of their folder: every store
that opens asks for it, and loading the scripts costs tens of milliseconds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mnestoma.maintenance import migration


@pytest.fixture
def scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the package's scripts that the package reads instead of its own."""
    folder = tmp_path / "migrations"
    shutil.copytree(migration.migrations_path(), folder)
    monkeypatch.setattr(migration, "migrations_path", lambda: folder)
    return folder


def test_head_is_loaded_once_while_the_scripts_do_not_change(
    scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[object] = []
    real = migration.ScriptDirectory.from_config

    def counting(cfg: object) -> object:
        loads.append(cfg)
        return real(cfg)

    monkeypatch.setattr(migration.ScriptDirectory, "from_config", counting)
    head = migration.head_revision()
    assert migration.head_revision() == head
    assert head in migration.known_revisions()
    assert len(loads) == 1


def test_a_revision_added_to_the_scripts_becomes_the_head(scripts: Path) -> None:
    head = migration.head_revision()
    (scripts / "versions" / "9999_added.py").write_text(
        f'revision = "9999_added"\ndown_revision = "{head}"\nbranch_labels = None\n'
        "depends_on = None\n\n\ndef upgrade() -> None:\n    pass\n\n\n"
        "def downgrade() -> None:\n    pass\n"
    )
    assert migration.head_revision() == "9999_added"
    assert {head, "9999_added"} <= migration.known_revisions()
    (scripts / "versions" / "9999_added.py").unlink()
    assert migration.head_revision() == head
