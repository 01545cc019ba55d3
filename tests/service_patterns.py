"""How a service embeds the store with its own plain ``create_engine`` engine (the patterns
of the services guide).

Each pattern is one request: the service writes a row of its own, then records a turn of
passings through the package, in the service's session and transaction. Used by threads and
by child processes (spawn context), so it lives in an importable module.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

import mnestoma

SERVICE_TABLE = "CREATE TABLE IF NOT EXISTS service_log (id INTEGER PRIMARY KEY, note TEXT)"
TURN = [
    ("plan", "1", "search", "1"),
    ("search", "1", "read", "1"),
    ("read", "1", "ocr", None, False),
]


def service_engine(url: str) -> Engine:
    """The service's own engine: plain SQLAlchemy, none of the package's configuration."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url)


def joined(sessions: sessionmaker[Session], turn_id: str) -> None:
    """``UnitOfWork.joining(session)`` inside the service's transaction."""
    with sessions() as session:
        session.execute(text("INSERT INTO service_log (note) VALUES (:n)"), {"n": turn_id})
        with mnestoma.UnitOfWork.joining(session) as uow:
            uow.mnests.record_turn(turn_id, TURN)
            uow.commit()
        session.commit()


def repository(sessions: sessionmaker[Session], turn_id: str) -> None:
    """``MnestRepository(session)`` and the service's own ``session.commit()``."""
    with sessions() as session:
        session.execute(text("INSERT INTO service_log (note) VALUES (:n)"), {"n": turn_id})
        mnestoma.MnestRepository(session).record_turn(turn_id, TURN)
        session.commit()


def unit_of_work(sessions: sessionmaker[Session], turn_id: str) -> None:
    """A package ``UnitOfWork`` on the service's session factory."""
    with mnestoma.UnitOfWork(sessions) as uow:
        uow.mnests.record_turn(turn_id, TURN)
        uow.commit()


PATTERNS: dict[str, Callable[[sessionmaker[Session], str], None]] = {
    "joined": joined,
    "repository": repository,
    "unit_of_work": unit_of_work,
}


def run_threads(url: str, pattern: str, threads: int, turns: int, prefix: str) -> list[str]:
    """``threads`` threads × ``turns`` requests; the errors seen, as text."""
    engine = service_engine(url)
    sessions = sessionmaker(bind=engine)
    work = PATTERNS[pattern]
    errors: list[str] = []
    lock = threading.Lock()

    def loop(t: int) -> None:
        for i in range(turns):
            try:
                work(sessions, f"{prefix}-{t}-{i}")
            except Exception as err:  # the test asserts there are none
                with lock:
                    errors.append(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")

    pool = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    engine.dispose()
    return errors


def process_main(url: str, pattern: str, threads: int, turns: int, prefix: str, out: Any) -> None:
    """A child process: its errors go back through ``out``."""
    out.put(run_threads(url, pattern, threads, turns, prefix))


def migrate_main(url: str, start: Any, out: Any) -> None:
    """A child process that migrates the database once ``start`` is set."""
    start.wait()
    try:
        mnestoma.upgrade(url)
        out.put(("ok", mnestoma.current_revision(url)))
    except Exception as err:
        out.put(("error", f"{type(err).__name__}: {err}"))
