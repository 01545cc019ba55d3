"""What the commands print reads right: counts agree with their nouns ("1 ager run"), an
estimate is never "about 0" of an empty table, and each revision an upgrade names is a
whole sentence, not a docstring's first line cut halfway."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from cli_kit import run, run_ok
from sqlalchemy import create_engine, text

import mnestoma
from mnestoma import Mnestoma
from mnestoma.maintenance import status as status_module
from mnestoma.maintenance.migration import alembic_config
from mnestoma.maintenance.status import collect_status, render_status


def test_copy_counts_one_of_each_in_the_singular(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'one.sqlite'}"
    with Mnestoma(source) as store:
        store.record_passing("a", "1", "b", "1")
        store.log_canonical_query("q", "q")
        store.apply_ager()
    out = run_ok("copy", "--from", source, "--to", f"sqlite:///{tmp_path / 'to.sqlite'}").stdout
    first = out.splitlines()[0]
    assert first.startswith("copied 1 mnest, 1 event, 1 query-log entry, 1 ager run"), first
    assert not re.search(r"\b1 [\w-]+s\b", first), first


def test_an_appending_copy_counts_one_merged_edge_in_the_singular(tmp_path: Path) -> None:
    laptop, server = (f"sqlite:///{tmp_path / name}.sqlite" for name in ("laptop", "server"))
    with Mnestoma(laptop) as one, Mnestoma(server) as other:
        one.record_turn("t-1", [("a", "1", "b", "1")])
        other.record_turn("t-1", [("a", "1", "b", "1")])
    out = run_ok("copy", "--from", laptop, "--to", server, "--append").stdout
    assert "merged 1 edge that both stores held (1 turn counted once)" in out, out


def _events_only(url: str) -> None:
    with Mnestoma(url) as store:
        for i in range(30):
            store.record_passing(f"a{i % 3}", "1", "b", "1", turn_id=f"t{i}", outcome="ok")


def test_an_empty_query_log_is_0_entries_not_about_0(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events estimated from the catalogue, the query log empty: its estimate, 0, is
    counted instead, and shown without "about"."""
    _events_only(pg_store_url)
    engine = create_engine(pg_store_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE events"))
        conn.execute(text("ANALYZE canonical_query_log"))
    engine.dispose()
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    st = collect_status(pg_store_url)
    shown = render_status(st)
    assert "query log  0 entries" in shown and "about 0" not in shown
    assert "events     about " in shown  # the events are still estimated
    assert st.estimated and not st.query_log_estimated and st.query_log == 0


def test_a_query_log_counted_is_not_shown_as_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite samples its events but always counts its query log: "1 entry", exact."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    _events_only(url)
    with Mnestoma(url) as store:
        store.log_canonical_query("q", "q")
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    st = collect_status(url)
    assert "query log  1 entry\n" in render_status(st)
    assert st.estimated and not st.query_log_estimated


def _first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    found = re.match(r"(.+?[.!?])(?=\s|$)", paragraph)
    assert found is not None, paragraph
    return found.group(1)


def test_each_revision_an_upgrade_names_is_a_whole_sentence(tmp_path: Path) -> None:
    result = run_ok("db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 's.sqlite'}")
    lines = [line for line in result.stderr.splitlines() if "Running upgrade" in line]
    script = ScriptDirectory.from_config(alembic_config())
    revisions = list(reversed(list(script.walk_revisions())))
    assert len(lines) == len(revisions) == int(mnestoma.head_revision())
    for line, rev in zip(lines, revisions, strict=True):
        below = rev.down_revision or "base"
        assert line.endswith(f"Running upgrade {below} -> {rev.revision}, "
                             f"{_first_sentence(rev.doc)}"), line  # fmt: skip
        assert line.endswith((".", "!", "?")) and "``" not in line, line


def test_a_downgrade_names_its_revisions_in_whole_sentences_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    mnestoma.upgrade(url)
    result = run("db", "downgrade", "0007", "--database-url", url)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "Running downgrade" in line]
    assert lines and all(line.endswith(".") and "``" not in line for line in lines), lines
