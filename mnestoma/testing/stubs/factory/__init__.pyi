# Types for the part of factory-boy that mnestoma.testing uses: factory-boy ships a
# py.typed marker but leaves its functions unannotated, which mypy --strict refuses.

from collections.abc import Callable
from typing import Any

from . import alchemy as alchemy

class BaseDeclaration: ...

class LazyFunction(BaseDeclaration):
    def __init__(self, function: Callable[[], Any]) -> None: ...

class LazyAttribute(BaseDeclaration):
    def __init__(self, function: Callable[[Any], Any]) -> None: ...

class Sequence(BaseDeclaration):
    def __init__(self, function: Callable[[int], Any]) -> None: ...

class SelfAttribute(BaseDeclaration):
    def __init__(self, attribute_name: str, default: Any = ...) -> None: ...

class SubFactory(BaseDeclaration):
    def __init__(self, factory: type[Factory] | str, **kwargs: Any) -> None: ...

class Maybe(BaseDeclaration):
    def __init__(
        self,
        decider: str | BaseDeclaration,
        yes_declaration: Any = ...,
        no_declaration: Any = ...,
    ) -> None: ...

class Trait:
    def __init__(self, **overrides: Any) -> None: ...

class FactoryOptions:
    model: Any
    abstract: bool

class Factory:
    _meta: FactoryOptions
    # Calling a factory class builds or creates a model instance, not a factory.
    def __new__(cls, *args: Any, **kwargs: Any) -> Any: ...
    @classmethod
    def build(cls, **kwargs: Any) -> Any: ...
    @classmethod
    def build_batch(cls, size: int, **kwargs: Any) -> list[Any]: ...
    @classmethod
    def create(cls, **kwargs: Any) -> Any: ...
    @classmethod
    def create_batch(cls, size: int, **kwargs: Any) -> list[Any]: ...
    @classmethod
    def reset_sequence(cls, value: int | None = None, force: bool = False) -> None: ...
    @classmethod
    def _adjust_kwargs(cls, **kwargs: Any) -> dict[str, Any]: ...
    @classmethod
    def _build(cls, model_class: Any, *args: Any, **kwargs: Any) -> Any: ...
    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Any: ...
