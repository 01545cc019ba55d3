from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from . import Factory, FactoryOptions

class SQLAlchemyOptions(FactoryOptions):
    sqlalchemy_session: Session | None
    sqlalchemy_session_factory: Callable[[], Session] | None
    sqlalchemy_session_persistence: str | None
    sqlalchemy_get_or_create: tuple[str, ...]

class SQLAlchemyModelFactory(Factory):
    _meta: SQLAlchemyOptions
    @classmethod
    def _save(
        cls, model_class: Any, session: Session, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...
