"""Events handed to pg_partman (contract §12; the operations guide, "Handing events to
pg_partman"): pg_partman installed from the operating system's packages where the server
lacks it, ``events`` handed over by the guide's own commands in a database of its own,
pg_partman's plain months made ahead after the package's months by kind and none by the
package (no DDL at all), retention as the guide says with and without a retention held by
pg_partman (pg_partman's months copied, the ``created`` event of every mnest still stored
kept), writes and reads, the schema comparison clean, and the way back."""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from conftest import PG_ADMIN_URL, REPO, create_pg_database, drop_pg_database, require_postgresql
from schema_kit import schema_diff
from sqlalchemy import Engine, NullPool, create_engine, text
from sqlalchemy.engine import URL, make_url

import mnestoma
from mnestoma import Mnestoma, Passing
from mnestoma.engines import make_engine
from mnestoma.engines import partman as partman_module
from mnestoma.engines.partman import Partman, holds_retention, look, makes_months
from mnestoma.maintenance import retention
from mnestoma.maintenance.copying import copy_store
from mnestoma.maintenance.migration import is_store_name
from mnestoma.maintenance.status import collect_status
from mnestoma.schema.sql.partitions import is_layout_name
from mnestoma.schema.sql.splitting import LEGACY_PARTITIONS
from mnestoma.testing.clock import MovableClock

GUIDE = REPO / "docs" / "operations.md"
SECTION = "### Handing events to pg_partman"
PARTMAN_MONTH = re.compile(r"^events_p([0-9]{4,5})_([0-9]{2})$")
# A leaf of a month by kind (revision 0015): its month's name and the kinds it holds.
LEAF = re.compile(r"^(events_[0-9]{6,7})_(created|rest)$")
# The guide's premake, raised so that pg_partman makes months of its own at once (it takes
# over from the end of the package's months, four or five months ahead of now).
PREMAKE = 8
# How long an install from the operating system's packages may take (seconds).
INSTALL_TIMEOUT_S = 600


# --- pg_partman on the server ----------------------------------------------------------------


def _admin() -> Engine:
    return create_engine(PG_ADMIN_URL, poolclass=NullPool)


def _available() -> bool:
    engine = _admin()
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman'")
            )
            return found.first() is not None
    finally:
        engine.dispose()


def _apt_install(package: str) -> str | None:
    """Install ``package`` with apt-get (its lists updated when the first try fails); why
    not, or None. One install at a time among the suite's workers."""
    if os.geteuid() != 0:
        return f"pg_partman is missing and only root may apt-get install {package}"
    apt = shutil.which("apt-get")
    if apt is None:
        return f"pg_partman is missing and there is no apt-get to install {package} with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-qq", package]
    lock = os.path.join(tempfile.gettempdir(), "mnestoma-test-partman-install.lock")
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            done = subprocess.run(
                install, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S
            )
            if done.returncode != 0:
                subprocess.run(
                    [apt, "update", "-qq"],
                    capture_output=True,
                    env=env,
                    timeout=INSTALL_TIMEOUT_S,
                )
                done = subprocess.run(
                    install, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S
                )
        except subprocess.TimeoutExpired:
            return f"apt-get install {package} took over {INSTALL_TIMEOUT_S} s (no network?)"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"apt-get could not install {package} (no network?): {said}"
    return None


@functools.cache
def partman_problem() -> str | None:
    """Why pg_partman cannot be used on the test server (None: it can), installed from the
    operating system's packages when the server runs here and lacks it."""
    if _available():
        return None
    engine = _admin()
    try:
        with engine.connect() as conn:
            major = conn.execute(text("SELECT current_setting('server_version_num')::int / 10000"))
            version = int(major.scalar_one())
    finally:
        engine.dispose()
    host = make_url(PG_ADMIN_URL).host
    if host not in (None, "", "127.0.0.1", "localhost", "::1") and not host.startswith("/"):
        return f"pg_partman is not available on the PostgreSQL server at {host}"
    problem = _apt_install(f"postgresql-{version}-partman")
    if problem is not None:
        return problem
    if not _available():
        return f"postgresql-{version}-partman is installed but the server does not offer it"
    return None


# --- the guide's commands --------------------------------------------------------------------


def guide_blocks() -> list[str]:
    """The SQL blocks of the guide's section on pg_partman, in order."""
    page = GUIDE.read_text(encoding="utf-8")
    start = page.index(SECTION)
    end = page.find("\n## ", start)
    return re.findall(r"```sql\n(.*?)```", page[start:end], re.S)


def _block(first_line: str) -> str:
    [found] = [b for b in guide_blocks() if b.startswith(first_line)]
    return found


def query_script(url: URL, script: str) -> list[list[tuple[object, ...]]]:
    """The rows of each statement of ``script`` (queries separated by ``;`` at a line's end)."""
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    statements = [q for q in re.split(r";\s*\n", script) if q.strip()]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [conn.execute(q.encode()).fetchall() for q in statements]


CHECK = "SELECT part, lower FROM mnestoma_events_bounds()"


def run_script(url: URL, script: str) -> None:
    """``script`` (several statements, its own BEGIN and COMMIT) as psql would run it."""
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(script.encode())


@pytest.fixture
def handed() -> Iterator[URL]:
    """A database of its own at head, its events handed to pg_partman by the guide's
    commands (pg_partman's premake raised, its maintenance run once)."""
    require_postgresql()
    problem = partman_problem()
    if problem is not None:
        pytest.skip(problem)
    url = create_pg_database("mnestoma_partman")
    try:
        mnestoma.upgrade(url.render_as_string(hide_password=False))
        setup = _block("CREATE SCHEMA partman;")
        setup = setup.replace("<database>", str(url.database))
        run_script(url, setup.replace("<services_role>", "CURRENT_USER"))
        assert query_script(url, _block(CHECK)) == [[], []]  # nothing stops pg_partman later
        run_script(url, _block("BEGIN;"))
        run_script(
            url,
            f"UPDATE partman.part_config SET premake = {PREMAKE}"
            " WHERE parent_table = 'public.events';"
            " SELECT partman.run_maintenance('public.events');",
        )
        yield url
    finally:
        drop_pg_database(url, later=True)


# --- what the database holds -----------------------------------------------------------------


def _engine(url: URL) -> Engine:
    return create_engine(url, poolclass=NullPool)


def partitions(url: URL) -> dict[str, tuple[datetime | None, datetime | None]]:
    """Each partition of events and its bounds (None: MINVALUE, or the default's)."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT c.relname, CASE WHEN b.lower > '-infinity' THEN b.lower END, b.upper"
                    " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " LEFT JOIN mnestoma_events_bounds() b ON b.part::oid = c.oid"
                    " WHERE i.inhparent = 'events'::regclass"
                )
            ).all()
    finally:
        engine.dispose()
    return {name: (lower, upper) for name, lower, upper in rows}


# The forms of a partition of events (forms()).
BY_KIND = "by kind"
PLAIN = "plain"
RANGES = "by range"


def forms(url: URL) -> dict[str, str]:
    """The form of each partition of events but the default: a month by kind (partitioned by
    list of kind), a plain table, or one partitioned by range (what retention keeps)."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT c.relname, c.relkind::text, pg_get_partkeydef(c.oid)"
                    " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = 'events'::regclass"
                    " AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'"
                )
            ).all()
    finally:
        engine.dispose()
    found = {}
    for name, relkind, key in rows:
        if relkind == "r":
            found[name] = PLAIN
        elif key == "LIST (kind)":
            found[name] = BY_KIND
        else:
            assert key == "RANGE (ts)", (name, key)
            found[name] = RANGES
    return found


def month_of(table: str) -> str:
    """The partition of events that holds ``table``: a leaf of a month by kind is its
    month's; a plain month, or the default, is its own."""
    leaf = LEAF.match(table)
    return table if leaf is None else leaf[1]


def where(url: URL, mnest_id: str) -> list[tuple[str, str]]:
    """(table, kind) of each event of ``mnest_id``, by id: the leaf that holds it."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT tableoid::regclass::text, kind FROM events WHERE mnest_id = :m"
                    " ORDER BY id"
                ),
                {"m": mnest_id},
            )
            return [(p, k) for p, k in rows]
    finally:
        engine.dispose()


def month(at: datetime, ahead: int = 0) -> datetime:
    """The first instant (UTC) of the month ``ahead`` months after ``at``'s."""
    n = at.year * 12 + at.month - 1 + ahead
    return datetime(n // 12, n % 12 + 1, 1, tzinfo=UTC)


def partman_months(parts: dict[str, tuple[datetime | None, datetime | None]]) -> list[datetime]:
    """The months pg_partman made (by their names), oldest first, each checked to be bounded
    by its month (UTC)."""
    found = []
    for name, (lower, upper) in parts.items():
        named = PARTMAN_MONTH.match(name)
        if named is None:
            continue
        first = datetime(int(named[1]), int(named[2]), 1, tzinfo=UTC)
        assert (lower, upper) == (first, month(first, 1)), name
        found.append(first)
    return sorted(found)


DDL_LOG = """
CREATE SCHEMA audit;
CREATE TABLE audit.ddl_log (tag text, object text);
CREATE FUNCTION audit.ddl_logged() RETURNS event_trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        INSERT INTO audit.ddl_log VALUES (r.command_tag, r.object_identity);
    END LOOP;
END
$fn$;
CREATE EVENT TRIGGER ddl_logged ON ddl_command_end EXECUTE FUNCTION audit.ddl_logged();
"""


def ddl_run(url: URL) -> list[tuple[str, str]]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return [(t, o) for t, o in conn.execute(text("SELECT tag, object FROM audit.ddl_log"))]
    finally:
        engine.dispose()


def maintenance(url: URL) -> None:
    """pg_partman's maintenance of events, as its background worker or cron runs it."""
    run_script(url, "SELECT partman.run_maintenance('public.events');")


# --- the tests -------------------------------------------------------------------------------


def test_the_names_of_pg_partmans_months_and_template_are_the_stores() -> None:
    for name in (
        "events_p2027_05",
        "events_p2027_12",
        "events_p10000_01",
        "events_template",
        "template_public_events",
        "template_mnestoma_events",
    ):
        assert is_store_name(name) and is_layout_name(name), name
    for name in ("events_p2027_13", "events_p2027_5", "events_pattern", "template_public_x"):
        assert not is_store_name(name), name


def test_without_pg_partman_the_package_keeps_its_upkeep(pg_store_url: str) -> None:
    engine = make_engine(pg_store_url)
    try:
        partman_module.forget_partman(engine)
        with engine.connect() as conn:
            assert look(conn) == Partman()
            assert not holds_retention(conn)
        assert not makes_months(engine)
    finally:
        engine.dispose()


def test_pg_partman_makes_the_months_ahead_and_the_package_none(handed: URL) -> None:
    parts = partitions(handed)
    made = partman_months(parts)
    now = datetime.now(UTC)
    package_end = max(u for n, (_, u) in parts.items() if u is not None and n not in {
        f"events_p{m:%Y_%m}" for m in made
    })  # fmt: skip
    # From the end of the package's months to PREMAKE months after the current one.
    # (pg_partman rounds the months from now to its last: one more past mid-month.)
    assert made[0] == package_end
    assert month(now, PREMAKE) <= made[-1] <= month(now, PREMAKE + 1)
    assert made == [month(package_end, i) for i in range(len(made))]
    assert all(is_store_name(n) for n in parts) and is_store_name("events_template")
    # Counted in months, not leaves: the package's months by kind, pg_partman's plain.
    shapes = forms(handed)
    ours = {n for n in shapes if PARTMAN_MONTH.match(n) is None}
    assert {shapes[f"events_p{m:%Y_%m}"] for m in made} == {PLAIN}
    assert ours and {shapes[n] for n in ours} == {BY_KIND}
    assert set(parts) == {*shapes, "events_default"}
    assert min(parts[n][0] for n in ours) == month(now)  # no partition before the current month

    run_script(handed, DDL_LOG)
    gap = month(made[-1], 2)  # no partition holds it: the package would make it
    url = handed.render_as_string(hide_password=False)
    with Mnestoma(url, clock=MovableClock(gap + timedelta(days=3))) as ahead:
        far = ahead.record_passing("plan", "1", "search", "1")
    with Mnestoma(url) as store:  # the system's clock: the current month is made
        edge = store.record_passing("plan", "1", "answer", "1")
        edge = store.record_passing("plan", "1", "answer", "1")
        assert [e.kind for e in store.events(mnest_id=edge.id)] == ["created", "reinforced"]
        assert store.get(far.id).uses == 1 and edge.uses == 2
    assert partitions(handed) == parts
    assert ddl_run(handed) == []
    assert where(handed, far.id) == [("events_default", "created")]
    current = where(handed, edge.id)
    [current_month] = {month_of(t) for t, _ in current}  # one month: the package's, by kind
    assert shapes[current_month] == BY_KIND
    assert current == [
        (f"{current_month}_created", "created"),
        (f"{current_month}_rest", "reinforced"),
    ]

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert schema_diff(conn) == []
    finally:
        engine.dispose()
    # A row dated past pg_partman's months stops its maintenance once it reaches that
    # month; a mistake's row deleted, its maintenance goes on.
    run_script(handed, f"DELETE FROM events WHERE mnest_id = '{far.id}';")
    maintenance(handed)


def dropped_unread(url: URL, before: datetime) -> int:
    """How many months a prune at ``before`` would drop without reading them (by kind)."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return retention.months_dropped_whole(conn, before)
    finally:
        engine.dispose()


def _written(url: str, first: datetime) -> tuple[str, str]:
    """An edge created and reinforced in pg_partman's first month, one at the system's time:
    their ids."""
    with Mnestoma(url, clock=MovableClock(first + timedelta(days=5))) as store:
        ahead = store.record_passing("plan", "1", "search", "1")
        store.record_passing("plan", "1", "search", "1")
    with Mnestoma(url) as store:
        now = store.record_passing("plan", "1", "answer", "1")
        store.record_passing("plan", "1", "answer", "1")
    return ahead.id, now.id


def test_the_guides_check_lists_what_would_stop_pg_partman_later() -> None:
    require_postgresql()
    url = create_pg_database("mnestoma_partman_check")
    try:
        mnestoma.upgrade(url.render_as_string(hide_password=False))
        assert query_script(url, _block(CHECK)) == [[], []]
        now = datetime.now(UTC)
        stray, ahead = month(now, 12), month(now, 6) + timedelta(days=2)
        run_script(
            url,
            f"SELECT mnestoma_events_partitions('{stray.isoformat()}', 0);"
            " INSERT INTO events (mnest_id, kind, ts, recorder)"
            f" VALUES ('m', 'created', '{ahead.isoformat()}', 'call');",
        )
        gaps, rows = query_script(url, _block(CHECK))
        assert [(str(p), lower) for p, lower in gaps] == [(f"events_{stray:%Y%m}", stray)]
        assert [ts for _, ts in rows] == [ahead]
    finally:
        drop_pg_database(url, later=True)


def test_without_a_pg_partman_retention_the_prune_drops_its_months_as_the_packages(
    handed: URL,
) -> None:
    url = handed.render_as_string(hide_password=False)
    first = partman_months(partitions(handed))[0]
    ahead, now = _written(url, first)
    cutoff = month(first, 1)
    # pg_partman's month is plain: it and every partition before it (the package's months
    # by kind among them) take the path that copies what it keeps, its count exact.
    assert dropped_unread(handed, cutoff) == 0
    with Mnestoma(url) as store:
        assert store.prune_events(cutoff, dry_run=True) == 2
        assert store.prune_events(cutoff) == 2
        assert [e.kind for e in store.events(mnest_id=ahead)] == ["created"]
        assert [e.kind for e in store.events(mnest_id=now)] == ["created"]
    parts = partitions(handed)
    kept = f"events_to_{cutoff:%Y%m}"
    assert where(handed, ahead) == [(kept, "created")] and where(handed, now) == [(kept, "created")]
    assert f"events_p{first:%Y_%m}" not in parts and parts[kept] == (None, cutoff)
    assert partman_months(parts)[0] == cutoff  # its later months stay
    maintenance(handed)  # one month of its naming is newer than every other: it goes on
    assert partitions(handed) == parts


def test_without_a_pg_partman_retention_the_prunes_keep_every_live_mnests_created_event(
    handed: URL,
) -> None:
    url = handed.render_as_string(hide_password=False)
    parts = partitions(handed)
    first = partman_months(parts)[0]
    ours = [n for n, f in forms(handed).items() if f == BY_KIND]
    start = min(parts[n][0] or first for n in ours)  # the package's first month
    # Edges created (and reinforced) in a month of the package's ahead, before its first
    # month (no partition holds it, and while handed nothing makes it: the default holds
    # them), in pg_partman's first month, at the system's time; one more, gone since.
    at = {
        "ahead": month(start, 1),
        "before": month(start, -3),
        "partman": first,
        "gone": month(start, 2),
    }
    ids = {}
    for name, when in at.items():
        with Mnestoma(url, clock=MovableClock(when + timedelta(days=5))) as store:
            ids[name] = store.record_passing("plan", "1", name, "1").id
            store.record_passing("plan", "1", name, "1")
    with Mnestoma(url) as store:
        ids["now"] = store.record_passing("plan", "1", "now", "1").id
        store.record_passing("plan", "1", "now", "1")
    assert {t for t, _ in where(handed, ids["before"])} == {"events_default"}
    assert {t for t, _ in where(handed, ids["partman"])} == {f"events_p{first:%Y_%m}"}
    gone = ids.pop("gone")
    run_script(handed, f"DELETE FROM mnests WHERE id = '{gone}';")
    live = sorted(ids.values())

    # A cutoff at pg_partman's first month: the package's months by kind, dropped unread.
    assert dropped_unread(handed, first) == len(ours)
    with Mnestoma(url) as store:
        store.prune_events(first)
        for mnest_id in live:
            kinds = [e.kind for e in store.events(mnest_id=mnest_id)]
            assert kinds == ["created", "reinforced"][: 2 if mnest_id == ids["partman"] else 1]
    kept = f"events_to_{first:%Y%m}"
    assert forms(handed)[kept] == RANGES and partitions(handed)[kept] == (None, first)
    assert where(handed, ids["before"]) == [(f"{kept}_default", "created")]
    assert where(handed, gone) == []  # its created event not kept
    maintenance(handed)  # the partition of everything before does not stop it

    # A cutoff past pg_partman's first month: a plain month, so the copying path (exact).
    cutoff = month(first, 1)
    assert dropped_unread(handed, cutoff) == 0
    with Mnestoma(url) as store:
        assert store.prune_events(cutoff, dry_run=True) == 1  # the reinforced in its month
        assert store.prune_events(cutoff) == 1
        for mnest_id in live:
            assert [e.kind for e in store.events(mnest_id=mnest_id)] == ["created"], mnest_id
    after = partitions(handed)
    final = f"events_to_{cutoff:%Y%m}"
    assert forms(handed)[final] == PLAIN and after[final] == (None, cutoff)
    assert kept not in after and f"events_p{first:%Y_%m}" not in after
    for mnest_id in live:
        assert where(handed, mnest_id) == [(final, "created")]
    assert partman_months(after)[0] == cutoff
    maintenance(handed)
    assert partitions(handed) == after
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert schema_diff(conn) == []
    finally:
        engine.dispose()


def test_with_a_pg_partman_retention_the_prune_deletes_rows_only(handed: URL) -> None:
    run_script(
        handed,
        "UPDATE partman.part_config SET retention = '1 month'"
        " WHERE parent_table = 'public.events';",
    )
    url = handed.render_as_string(hide_password=False)
    first = partman_months(partitions(handed))[0]
    ahead, now = _written(url, first)
    parts = partitions(handed)
    before = {m: where(handed, m) for m in (ahead, now)}
    with Mnestoma(url) as store:
        assert store.prune_events(month(first, 1), dry_run=True) == 2
        assert store.prune_events(month(first, 1)) == 2
    assert partitions(handed) == parts  # no partition dropped
    for m, events in before.items():
        assert where(handed, m) == [(p, k) for p, k in events if k == "created"]
    assert where(handed, ahead) == [(f"events_p{first:%Y_%m}", "created")]


def test_a_month_made_by_both_renamed_to_pg_partmans_name(handed: URL) -> None:
    url = handed.render_as_string(hide_password=False)
    both = month(partman_months(partitions(handed))[-1], 1)
    # A process that made a month in the minute of the handover: the package's, by kind.
    run_script(handed, f"SELECT mnestoma_events_partitions('{both.isoformat()}', 0);")
    ours = f"events_{both:%Y%m}"
    assert forms(handed)[ours] == BY_KIND
    run_script(
        handed,
        f"UPDATE partman.part_config SET premake = {PREMAKE + 2}"
        " WHERE parent_table = 'public.events';",
    )
    with pytest.raises(psycopg.Error, match="overlap"):
        maintenance(handed)
    run_script(handed, f"ALTER TABLE {ours} RENAME TO events_p{both:%Y_%m};")
    maintenance(handed)  # it takes that month for its own and goes on after it
    made = partman_months(partitions(handed))
    assert both in made and made[-1] > both
    renamed = f"events_p{both:%Y_%m}"
    assert forms(handed)[renamed] == BY_KIND  # its leaves keep their names
    with Mnestoma(url, clock=MovableClock(both + timedelta(days=5))) as store:
        edge = store.record_passing("plan", "1", "search", "1")
        store.record_passing("plan", "1", "search", "1")
    leaves = [(f"{ours}_created", "created"), (f"{ours}_rest", "reinforced")]
    assert where(handed, edge.id) == leaves
    # Its leaves no longer carry its name: retention takes it for a plain month and copies.
    cutoff = month(both, 1)
    assert dropped_unread(handed, cutoff) == 0
    with Mnestoma(url) as store:
        assert store.prune_events(cutoff, dry_run=True) == 1
        assert store.prune_events(cutoff) == 1
    after = partitions(handed)
    assert renamed not in after
    assert where(handed, edge.id) == [(f"events_to_{cutoff:%Y%m}", "created")]
    maintenance(handed)
    assert partitions(handed) == after
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert schema_diff(conn) == []
    finally:
        engine.dispose()


PARTMAN_TABLES = text(
    "SELECT c.relname, c.oid::bigint, c.relkind::text, i.inhparent::regclass::text"
    " FROM pg_class c LEFT JOIN pg_inherits i ON i.inhrelid = c.oid"
    " WHERE c.relname ~ '^events_p[0-9]{4,5}_[0-9]{2}$' AND c.relkind IN ('r', 'p')"
)


def partman_tables(url: URL) -> dict[str, tuple[int, str, str | None]]:
    """Each table named as pg_partman's months: its oid, its kind (``r`` plain) and the
    table it is attached to (None: none)."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return {str(n): (int(o), str(k), p) for n, o, k, p in conn.execute(PARTMAN_TABLES)}
    finally:
        engine.dispose()


def test_split_history_leaves_pg_partmans_months_as_they_are(handed: URL) -> None:
    """pg_partman's months are plain tables, as the old layout's are, but its own: the
    catalogue's list of the old layout names none of them, nothing waits, and a run leaves
    each as it was (same table, attached, plain, its rows), pg_partman going on after."""
    url = handed.render_as_string(hide_password=False)
    first = partman_months(partitions(handed))[0]
    ahead, now = _written(url, first)  # rows in pg_partman's first month
    held = f"events_p{first:%Y_%m}"
    assert {t for t, _ in where(handed, ahead)} == {held}
    before = partman_tables(handed)
    assert held in before and {(k, p) for _, k, p in before.values()} == {("r", "events")}
    events = {m: where(handed, m) for m in (ahead, now)}
    engine = make_engine(url)
    try:
        with engine.connect() as conn:  # what the catalogue takes for the old layout's
            listed = [str(row[0]) for row in conn.execute(LEGACY_PARTITIONS)]
        assert not [n for n in listed if PARTMAN_MONTH.match(n)], listed
        with Mnestoma(engine) as store:
            dry = store.split_history(dry_run=True)
            assert dry.waiting == () and dry.partitions == ()
            report = store.split_history()
        assert report.partitions == () and report.months == () and report.copied == 0
    finally:
        engine.dispose()
    assert partman_tables(handed) == before  # the same tables, attached, plain
    assert {m: where(handed, m) for m in events} == events
    maintenance(handed)  # pg_partman goes on from its newest month


def _sqlite_store(path: Path, at: datetime) -> str:
    """A SQLite store whose events are all in ``at``'s month: a turn, a passing reinforced."""
    url = f"sqlite:///{path}"
    with Mnestoma(url, clock=MovableClock(at)) as store:
        store.record_turn("t1", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])
        store.record_passing("x", "1", "y", "1")
        store.record_passing("x", "1", "y", "1")
    return url


def test_copy_append_makes_no_month_where_pg_partman_makes_them(
    handed: URL, tmp_path: Path
) -> None:
    """A copy into a store handed to pg_partman, of events in a month it has not made yet,
    makes no partition (no DDL at all): they land in the default partition, the copy
    verified, and nothing waits for split-history there (pg_partman moves them)."""
    url = handed.render_as_string(hide_password=False)
    parts = partitions(handed)
    gap = month(partman_months(parts)[-1], 2)  # past pg_partman's premake: no partition holds it
    source = _sqlite_store(tmp_path / "source.sqlite", gap + timedelta(days=3))
    sqlite = create_engine(source, poolclass=NullPool)
    try:
        with sqlite.connect() as conn:
            copied = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
    finally:
        sqlite.dispose()
    run_script(handed, DDL_LOG)
    report = copy_store(source, url, append=True)
    assert report.rows["events"] == copied > 0
    assert partitions(handed) == parts  # no month of the package's, nor any other
    assert ddl_run(handed) == []
    engine = _engine(handed)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT tableoid::regclass::text, ts FROM events")).all()
    finally:
        engine.dispose()
    assert len(rows) == copied and {t for t, _ in rows} == {"events_default"}
    assert {month(ts) for _, ts in rows} == {gap}
    # the default partition is pg_partman's to empty: split-history and status leave it be
    with Mnestoma(url) as store:
        assert store.split_history(dry_run=True).waiting == ()
    assert collect_status(url).history_to_split == []


def test_handed_back_the_package_makes_the_months_again(
    handed: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = handed.render_as_string(hide_password=False)
    gap = month(partman_months(partitions(handed))[-1], 2)
    with Mnestoma(url, clock=MovableClock(gap + timedelta(days=3))) as store:
        first = store.record_passing("plan", "1", "search", "1")
        parts = partitions(handed)
        run_script(handed, _block("DELETE FROM partman.part_config"))
        # What was learned is trusted for PARTMAN_RECHECK_S: nothing made yet.
        second = store.record_passing("plan", "1", "answer", "1")
        assert partitions(handed) == parts
        monkeypatch.setattr(partman_module, "PARTMAN_RECHECK_S", 0.0)
        third = store.record_passing("plan", "1", "review", "1")
    made = partitions(handed)
    gap_month = f"events_{gap:%Y%m}"
    new_months = {f"events_{month(gap, i):%Y%m}" for i in range(4)}
    assert set(made) - set(parts) == new_months
    assert made[gap_month] == (gap, month(gap, 1))
    shapes = forms(handed)  # the package's months by kind again, pg_partman's plain as made
    assert {shapes[n] for n in new_months} == {BY_KIND}
    assert {shapes[n] for n in made if PARTMAN_MONTH.match(n)} == {PLAIN}
    for edge in (first, second, third):  # moved out of the default into their month's leaf
        assert where(handed, edge.id) == [(f"{gap_month}_created", "created")]
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert schema_diff(conn) == []
    finally:
        engine.dispose()
