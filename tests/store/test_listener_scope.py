"""The package's listeners stay on its own classes: a service's sessions pay nothing.

Importing mnestoma registers nothing on SQLAlchemy's ``Session`` or ``sessionmaker``. The
view ``v_mnestoma`` stays read-only all the same: a flush that writes a ``MnestomaView`` is
refused by a mapper event of that class, in the package's sessions and in a service's own;
an UPDATE or DELETE naming the view is refused when it is compiled, whoever runs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, String, delete, select, text, update
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    SessionEvents,
    mapped_column,
    sessionmaker,
)

import mnestoma
from mnestoma import Mnest, MnestomaView, ReadOnlyError, UnitOfWork
from mnestoma.engines import make_engine, make_session_factory
from mnestoma.schema.models import view_table

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SESSION_EVENTS = [n for n in dir(SessionEvents) if not n.startswith("_") and n != "dispatch"]
# Every module of the package that a service may import (the OpenTelemetry one needs its
# extra, and is left out where that is missing).
PACKAGE_MODULES = [
    "mnestoma",
    "mnestoma.aio",
    "mnestoma.tracing",
    "mnestoma.testing",
]


class ServiceBase(DeclarativeBase):
    """A service's own models, beside the store."""


class Note(ServiceBase):
    __tablename__ = "service_notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str] = mapped_column(String(40))


def _package_listeners(session: Session) -> list[str]:
    """The package's functions among the listeners a session runs (its class's, its
    sessionmaker's and its own)."""
    found = []
    for name in SESSION_EVENTS:
        for fn in getattr(session.dispatch, name):
            module = getattr(fn, "__module__", "") or ""
            if module.split(".")[0] == "mnestoma":
                found.append(f"{name}: {module}.{getattr(fn, '__qualname__', fn)}")
    return found


def _service_engine(url: str) -> Engine:
    """The service's own engine: plain SQLAlchemy, none of the package's configuration."""
    from sqlalchemy import create_engine

    return create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


@pytest.fixture
def service(store_url: str) -> Iterator[sessionmaker[Session]]:
    """The service's sessionmaker on its own engine, its table beside a store holding one
    active edge."""
    engine = _service_engine(store_url)
    ServiceBase.metadata.drop_all(engine)  # the PostgreSQL store is shared between tests
    ServiceBase.metadata.create_all(engine)
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")
    yield sessionmaker(engine)
    ServiceBase.metadata.drop_all(engine)
    engine.dispose()


def _weights(url: str) -> list[tuple[str, float, int]]:
    with mnestoma.Mnestoma(url) as store:
        return [(e.src_executor, e.weight, e.uses) for e in store.edges()]


def _view_copy(row: MnestomaView, **changes: Any) -> MnestomaView:
    values = {c.key: getattr(row, c.key) for c in view_table.columns}
    return MnestomaView(**{**values, **changes})


# --- nothing on SQLAlchemy's own classes ----------------------------------------------------


def test_importing_the_package_registers_nothing_on_sqlalchemys_session_or_sessionmaker() -> None:
    for module in PACKAGE_MODULES:
        importlib.import_module(module)
    assert _package_listeners(Session()) == []
    assert _package_listeners(sessionmaker()()) == []


def test_a_services_own_session_runs_none_of_the_packages_hooks(
    service: sessionmaker[Session], store_url: str
) -> None:
    with service() as joined:  # the package joined once into one of the service's sessions
        with UnitOfWork.joining(joined) as uow:
            uow.mnests.record_passing("b", "1", "c", "1")
            uow.commit()
        joined.commit()
    with service() as session:
        session.add(Note(body="hello"))
        session.flush()
        session.execute(update(Note).values(body="again"))
        assert session.scalars(select(Note.body)).all() == ["again"]
        assert _package_listeners(session) == []
        session.commit()


# --- the view stays read-only ---------------------------------------------------------------


def test_a_flush_writing_the_view_is_refused_in_the_packages_own_unit(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")
    before = _weights(store_url)
    engine = make_engine(store_url)
    try:
        with UnitOfWork(make_session_factory(engine)) as uow:
            row = uow.session.scalars(select(MnestomaView)).one()
            row.weight = 0.9
            with pytest.raises(ReadOnlyError, match="read-only"):
                uow.session.flush()
    finally:
        engine.dispose()
    assert _weights(store_url) == before


def _write_the_view(session: Session, row: MnestomaView, write: str, new_id: str) -> None:
    """Change ``row`` of the view in ``session`` (``update``: its weight and uses), add a
    copy of it under ``new_id`` (``insert``), or delete it; the flush is the caller's."""
    if write == "update":
        row.weight, row.uses = 0.9, 99
    elif write == "insert":
        session.add(_view_copy(row, id=new_id, src_executor="x"))
    else:
        session.delete(row)


@pytest.fixture(params=["update", "insert", "delete"])
def write(request: pytest.FixtureRequest) -> str:
    """How a test writes the view: an update, an insert of a copy, a delete."""
    return str(request.param)


def test_a_flush_writing_the_view_is_refused_in_a_service_session_the_package_joined(
    service: sessionmaker[Session], store_url: str, write: str
) -> None:
    before = _weights(store_url)
    with service() as session:
        with UnitOfWork.joining(session) as uow:
            assert len(uow.mnests.edges()) == 1
        row = session.scalars(select(MnestomaView)).one()
        _write_the_view(session, row, write, "mn_viewwrite00001")
        with pytest.raises(ReadOnlyError, match="read-only"):
            session.flush()
    assert _weights(store_url) == before


def test_a_flush_writing_the_view_is_refused_in_a_plain_service_session_that_loads_it(
    service: sessionmaker[Session], store_url: str, write: str
) -> None:
    before = _weights(store_url)
    with service() as session:
        row = session.get(MnestomaView, session.scalars(select(MnestomaView.id)).one())
        assert row is not None
        _write_the_view(session, row, write, "mn_viewwrite00002")
        with pytest.raises(ReadOnlyError, match="read-only"):
            session.commit()
    assert _weights(store_url) == before


@pytest.mark.parametrize("statement", ["update", "delete", "update_alias", "orm_update"])
def test_an_update_or_delete_naming_the_view_is_refused_on_a_plain_connection(
    service: sessionmaker[Session], store_url: str, statement: str
) -> None:
    before = _weights(store_url)
    alias = view_table.alias("v")
    statements = {
        "update": update(view_table).values(uses=99),
        "delete": delete(view_table),
        "update_alias": update(alias).values(uses=99),
        "orm_update": update(MnestomaView).values(weight=0.9),
    }
    engine = _service_engine(store_url)
    try:
        with engine.begin() as conn, pytest.raises(ReadOnlyError, match="read-only"):
            conn.execute(statements[statement])
    finally:
        engine.dispose()
    assert _weights(store_url) == before


def test_statements_that_only_read_the_view_still_run(
    service: sessionmaker[Session], store_url: str
) -> None:
    live = select(view_table.c.id).scalar_subquery()
    with service() as session:
        assert len(session.scalars(select(MnestomaView)).all()) == 1
        session.execute(update(Mnest).where(Mnest.id == live).values(uses=5))
        assert session.scalars(select(Mnest.uses)).all() == [5]
        # UPDATE mnests ... FROM v_mnestoma: the view is read, mnests written
        session.execute(update(Mnest).where(Mnest.id == view_table.c.id).values(uses=6))
        src = select(view_table.c.src_executor).scalar_subquery()
        session.execute(delete(Note).where(Note.body == src))
        session.commit()
    assert [uses for _, _, uses in _weights(store_url)] == [6]
    engine = _service_engine(store_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM v_mnestoma")).scalar_one() == 1
    finally:
        engine.dispose()
