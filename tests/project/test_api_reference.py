"""The API reference (docs/api) names every public name of the package, and each public
method and function it documents says what it returns and which errors it raises."""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import REPO

import mnestoma
from mnestoma.core import errors

API = REPO / "docs" / "api"
PACKAGE = Path(mnestoma.__file__).parent

# ``.. autoclass:: mnestoma.X`` / ``autofunction`` / ``automodule`` with its indented options.
DIRECTIVE = re.compile(r"^\.\. auto(class|function|module):: ([\w.]+)\n((?:   .*\n)*)", re.M)

# The documented methods and functions that raise none of the package's errors (nor any
# other on purpose): they alone may leave out a "Raises:" section. Every other one must have
# it, so a new public method is documented with what it raises, or listed here on purpose.
RAISES_NOTHING = {
    "mnestoma.Forecast.as_dict",
    "mnestoma.Forecast.p",
    "mnestoma.Mnestoma.close",
    "mnestoma.Mnestoma.replica_stats",
    "mnestoma.Mnestoma.unit_of_work",
    "mnestoma.aio.AsyncMnestoma.close",
    "mnestoma.aio.AsyncMnestoma.replica_stats",
    "mnestoma.aio.AsyncMnestoma.unit_of_work",
    "mnestoma.aio.make_async_session_factory",
    "mnestoma.make_session_factory",
    "mnestoma.head_revision",
    "mnestoma.testing.bind_factories",
    "mnestoma.testing.factories.bind_factories",
    "mnestoma.testing.mnestoma_clock",
    "mnestoma.testing.mnestoma_repository",
    "mnestoma.testing.mnestoma_session",
    "mnestoma.testing.mnestoma_uow",
    "mnestoma.tracing.current_turn",
    "mnestoma.tracing.propagate",
    "mnestoma.tracing.BackgroundWriter.submit",
    "mnestoma.tracing.TracerStats.add",
    "mnestoma.tracing.TracerStats.reset",
    "mnestoma.tracing.TracerStats.snapshot",
    "mnestoma.otel.MnestomaSpanProcessor.force_flush",
    "mnestoma.otel.MnestomaSpanProcessor.on_end",
    "mnestoma.otel.MnestomaSpanProcessor.on_start",
    "mnestoma.otel.MnestomaSpanProcessor.shutdown",
    "mnestoma.otel.value_digests",
}


def _documented() -> set[str]:
    names: set[str] = set()
    for page in API.glob("*.rst"):
        text = page.read_text()
        names |= set(re.findall(r"^\.\. auto(?:class|function):: mnestoma\.(\w+)$", text, re.M))
        for listed in re.findall(r":members: ([\w,\s]+?)(?:\n\n|\n?\Z)", text):
            names |= {n.strip() for n in listed.split(",")}
    return names


def test_every_public_name_of_the_package_is_in_the_api_reference() -> None:
    public = {name for name in mnestoma.__all__ if not name.startswith("_")}
    missing = public - _documented()
    assert not missing, f"not in docs/api: {sorted(missing)}"


def _resolve(dotted: str) -> Any:
    """The object a directive names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def _is_callable_member(value: Any) -> bool:
    return (inspect.isfunction(value) or inspect.ismethod(value)) and (
        getattr(value, "__module__", "") or ""
    ).startswith("mnestoma")


def _methods(owner: str, cls: type, *, inherited: bool) -> Iterator[tuple[str, Any]]:
    """The public methods autodoc shows for ``cls`` (properties are attributes, not here)."""
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") or isinstance(inspect.getattr_static(cls, name), property):
            continue
        if (inherited or name in vars(cls)) and _is_callable_member(value):
            yield f"{owner}.{name}", value


def _module_members(target: str, module: Any, options: str) -> Iterator[tuple[str, Any]]:
    listed = re.search(r":members:(.*?)(?=^   :|\Z)", options, re.M | re.S)
    names = re.findall(r"\w+", listed.group(1)) if listed else []
    names = names or module.__all__  # ":members:" alone: the module's public names
    for name in names:
        value = getattr(module, name)
        if inspect.isclass(value):
            yield from _methods(f"{target}.{name}", value, inherited=False)
        elif callable(value) and not name.isupper():  # functions, and the plugin's fixtures
            yield f"{target}.{name}", value


def documented_callables() -> dict[str, Any]:
    """Every public method and function the reference documents, by its documented name."""
    found: dict[str, Any] = {}
    for page in sorted(API.glob("*.rst")):
        for kind, target, options in DIRECTIVE.findall(page.read_text()):
            obj = _resolve(target)
            if kind == "function":
                found[target] = obj
            elif kind == "class" and ":members:" in options:
                inherited = ":inherited-members:" in options
                found.update(_methods(target, obj, inherited=inherited))
            elif kind == "module":
                found.update(_module_members(target, obj, options))
    return found


def _written_constructor(cls: type) -> bool:
    """Does building ``cls`` run code of the package (an ``__init__`` or ``__post_init__``
    written in its source, not one that ``dataclass`` or ``NamedTuple`` generated)?"""
    for name in ("__init__", "__post_init__"):
        code = getattr(getattr(cls, name, None), "__code__", None)
        if code is not None and Path(code.co_filename).is_relative_to(PACKAGE):
            return True
    return False


def documented_constructors() -> dict[str, type]:
    """Every class the reference documents whose constructor is the package's own code."""
    found: dict[str, type] = {}
    for page in sorted(API.glob("*.rst")):
        for kind, target, options in DIRECTIVE.findall(page.read_text()):
            obj = _resolve(target)
            if kind == "class":
                found[target] = obj
            elif kind == "module" and ":members:" in options:
                listed = re.search(r":members:(.*?)(?=^   :|\Z)", options, re.M | re.S)
                names = (re.findall(r"\w+", listed.group(1)) if listed else []) or obj.__all__
                found |= {f"{target}.{n}": getattr(obj, n) for n in names}
    return {
        name: cls
        for name, cls in found.items()
        if inspect.isclass(cls) and not issubclass(cls, BaseException) and _written_constructor(cls)
    }


def _section(doc: str, title: str) -> str | None:
    """The body of a Google-style section of ``doc`` (napoleon's), or None without one."""
    match = re.search(rf"^{title}:\n((?:[ \t]+.*\n?|\n)+)", doc, re.M)
    return None if match is None else match.group(1)


def test_the_walk_covers_both_facades_the_units_and_the_migrations() -> None:
    found = documented_callables()
    for name in (
        "mnestoma.Mnestoma.record_passing",
        "mnestoma.Mnestoma.graph",
        "mnestoma.aio.AsyncMnestoma.apply_ager",
        "mnestoma.UnitOfWork.commit",
        "mnestoma.MnestRepository.to_networkx",
        "mnestoma.aio.AsyncMnestRepository.record_turn",
        "mnestoma.upgrade",
        "mnestoma.testing.bound_session",
    ):
        assert name in found


def test_every_documented_method_says_what_it_returns() -> None:
    lacking = [
        name
        for name, value in documented_callables().items()
        if _section(inspect.getdoc(value) or "", "(?:Returns|Yields)") is None
    ]
    assert not lacking, f"no 'Returns:' (or 'Yields:') section: {sorted(lacking)}"


def test_every_documented_method_that_can_fail_says_what_it_raises() -> None:
    found = documented_callables()
    lacking = [
        name
        for name, value in found.items()
        if name not in RAISES_NOTHING and _section(inspect.getdoc(value) or "", "Raises") is None
    ]
    assert not lacking, f"no 'Raises:' section (or list it in RAISES_NOTHING): {sorted(lacking)}"
    stale = RAISES_NOTHING - set(found) - set(documented_constructors())
    assert not stale, f"RAISES_NOTHING names what the reference no longer documents: {stale}"
    every = {**found, **documented_constructors()}
    contradicted = [n for n in RAISES_NOTHING if _section(inspect.getdoc(every[n]) or "", "Raises")]
    assert not contradicted, f"in RAISES_NOTHING yet with a 'Raises:' section: {contradicted}"


def test_every_documented_class_says_what_building_it_raises() -> None:
    """A constructor has no "Returns:" (it builds the class); its errors are in the class's
    docstring, where napoleon shows them."""
    found = documented_constructors()
    lacking = [
        name
        for name, cls in found.items()
        if name not in RAISES_NOTHING and _section(inspect.getdoc(cls) or "", "Raises") is None
    ]
    assert not lacking, f"no 'Raises:' section in the class docstring: {sorted(lacking)}"
    assert "mnestoma.Mnestoma" in found and "mnestoma.Settings" in found


def test_every_raises_section_names_errors_that_exist() -> None:
    unknown: list[str] = []
    documented = {**documented_callables(), **documented_constructors()}
    for name, value in documented.items():
        body = _section(inspect.getdoc(value) or "", "Raises") or ""
        entries = re.findall(r"^    (\w+):", body, re.M)
        assert body == "" or entries, f"{name}: a 'Raises:' section without an entry"
        for error in entries:
            cls = getattr(errors, error, None) or getattr(builtins, error, None)
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                unknown.append(f"{name}: {error}")
    assert not unknown, f"not an exception of mnestoma.errors or builtins: {unknown}"
