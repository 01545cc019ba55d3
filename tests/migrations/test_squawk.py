"""squawk, the PostgreSQL migration linter, on the script of every revision after 0002.

From revision 0007 on, every revision must be safe on a live database (contract §10): its
PostgreSQL script, as ``mnestoma db sql`` prints it, passes squawk, or explains a finding
in a comment squawk honours (``-- squawk-ignore RULE``). Revisions 0003–0006 landed before
the rule; their PostgreSQL path now runs the same way (the schema each builds unchanged), so
they are linted too. 0001 and 0002 build and reshape tables no release ever wrote to at
scale and stay as they were.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from alembic.script import Script, ScriptDirectory

from mnestoma.maintenance.migration import alembic_config, offline_sql

LAST_REVISION_BEFORE_THE_RULE = "0002"


def squawk_findings(sql: str, tmp_path: Path, name: str) -> list[str]:
    """squawk's findings on ``sql``, one line each."""
    squawk = shutil.which("squawk")
    assert squawk is not None, "squawk is missing: it comes with the test extra (squawk-cli)"
    path = tmp_path / f"{name}.sql"
    path.write_text(sql)
    done = subprocess.run(
        [squawk, "--reporter", "gcc", str(path)], capture_output=True, text=True, check=False
    )
    findings = [
        line for line in done.stdout.splitlines() if ": warning: " in line or ": error: " in line
    ]
    assert done.returncode == (1 if findings else 0), done.stdout + done.stderr
    return findings


def revisions_under_the_rule() -> list[Script]:
    """Every revision after 0002, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    newer = script.walk_revisions(LAST_REVISION_BEFORE_THE_RULE, "heads")
    return [r for r in reversed(list(newer)) if r.revision != LAST_REVISION_BEFORE_THE_RULE]


def test_squawk_finds_what_locks_a_live_table(tmp_path: Path) -> None:
    """The linter CI relies on is there and reports an index built without CONCURRENTLY."""
    findings = squawk_findings("CREATE INDEX ix_events_ts ON events (ts);\n", tmp_path, "bad")
    assert any("require-concurrent-index-creation" in f for f in findings), findings


def test_every_revision_after_0002_passes_squawk(tmp_path: Path) -> None:
    for rev in revisions_under_the_rule():
        sql = offline_sql("postgresql://", f"{rev.down_revision}:{rev.revision}")
        assert squawk_findings(sql, tmp_path, rev.revision) == [], f"revision {rev.revision}"


def test_the_revision_before_the_rule_is_what_the_lint_would_refuse(tmp_path: Path) -> None:
    """The same lint on 0002's script (not linted) reports its plain CREATE INDEX: the
    harness reads a revision's script as CI would, and would catch one now."""
    sql = offline_sql("postgresql://", "0001:0002")
    findings = squawk_findings(sql, tmp_path, "0002")
    assert any("require-concurrent-index-creation" in f for f in findings), findings
