"""ORM bulk statements cannot write through the read-only view (``v_mnestoma``), while the
table itself stays writable (both engines)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from conftest import mnest_row
from sqlalchemy import insert

from mnestoma import Mnestoma
from mnestoma.schema.models import Mnest

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _view_session(store: Mnestoma):  # type: ignore[no-untyped-def]
    from mnestoma import make_session_factory

    return make_session_factory(store.engine)()


@pytest.mark.parametrize(
    "statement",
    ["orm_update", "orm_delete", "orm_insert", "core_update", "core_delete", "bulk_by_pk"],
)
def test_bulk_writes_through_the_view_are_refused(store: Mnestoma, statement: str) -> None:
    from sqlalchemy import delete, update

    from mnestoma.schema.models import MnestomaView, ReadOnlyError

    m = store.record_passing("a", "1", "b", "1")
    view = MnestomaView.__table__
    statements = {
        "orm_update": (update(MnestomaView).where(MnestomaView.id == m.id).values(weight=0.9),),
        "orm_delete": (delete(MnestomaView).where(MnestomaView.id == m.id),),
        "orm_insert": (
            insert(MnestomaView).values(**mnest_row(T0, src_executor="x", dst_executor="y")),
        ),
        "core_update": (update(view).where(view.c.id == m.id).values(uses=99),),
        "core_delete": (delete(view),),
        "bulk_by_pk": (update(MnestomaView), [{"id": m.id, "weight": 0.9}]),
    }
    with _view_session(store) as session:
        with pytest.raises(ReadOnlyError, match="read-only"):
            session.execute(*statements[statement])
        session.rollback()
        assert session.get(MnestomaView, m.id) is not None  # reading the view still works
    after = store.edges()
    assert [(r.id, r.weight, r.uses) for r in after] == [(m.id, m.weight, m.uses)]
    assert [e.kind for e in store.events()] == ["created"]


def test_bulk_writes_to_mnests_itself_are_not_refused(store: Mnestoma) -> None:
    from sqlalchemy import update

    m = store.record_passing("a", "1", "b", "1")
    with _view_session(store) as session:
        session.execute(update(Mnest).where(Mnest.id == m.id).values(tags={"k": "v"}))
        session.commit()
    assert store.get(m.id).tags == {"k": "v"}
