"""factory-boy factories whose rows pass every constraint of the schema (contract §2).

Factories write through the session bound by :func:`bind_factories` (the pytest plugin binds
``mnestoma_session`` for every test) and take "now" from the bound clock, so that an ``old``
edge is old for the ager too. Outside pytest::

    with bind_factories(session, clock=my_clock):
        MnestFactory.create_batch(3)

Only ``Mnest``, ``Event``, ``CanonicalQuery`` and ``MnestChain`` are built: the view
``v_mnestoma`` is read-only and the session refuses to flush it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import factory
from factory.alchemy import SQLAlchemyModelFactory
from sqlalchemy.orm import Session

from mnestoma.core.clock import Clock
from mnestoma.core.rules import (
    CHAIN_DECAY_LAMBDA,
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    EventKind,
    MnestState,
    new_mnest_id,
    spread_count,
)
from mnestoma.core.types import ensure_aware_utc
from mnestoma.schema.models import CanonicalQuery, Event, Mnest, MnestChain

__all__ = [
    "CanonicalQueryFactory",
    "DecayingMnestFactory",
    "EventFactory",
    "MnestChainFactory",
    "MnestFactory",
    "ProtoMnestFactory",
    "bind_factories",
    "bound_session",
    "factory_now",
]

SessionProvider = Callable[[], Session]


@dataclass
class _Binding:
    session: SessionProvider | None = None
    clock: Clock | None = None


_binding = _Binding()


@contextmanager
def bind_factories(
    session: Session | SessionProvider | None = None, *, clock: Clock | None = None
) -> Iterator[None]:
    """Make the factories write through ``session`` and read "now" from ``clock``.

    ``session`` may be a Session or a zero-argument callable returning one (asked for only
    when a factory first creates a row). The previous binding is restored on exit.

    Returns:
        A context manager: the binding holds inside its block.
    """
    provider: SessionProvider | None
    if session is None or isinstance(session, Session):
        provider = (lambda: session) if session is not None else None
    else:
        provider = session
    previous = _Binding(_binding.session, _binding.clock)
    _binding.session, _binding.clock = provider, clock
    try:
        yield
    finally:
        _binding.session, _binding.clock = previous.session, previous.clock


def bound_session() -> Session:
    """The session the factories write through; a clear error when none is bound.

    Returns:
        The bound Session.

    Raises:
        RuntimeError: no session is bound (not a package error: a set-up mistake).
    """
    if _binding.session is None:
        raise RuntimeError(
            "no session for mnestoma factories: use them inside a test of a suite with "
            'pytest_plugins = ["mnestoma.testing"], or wrap the code in bind_factories(session)'
        )
    return _binding.session()


def factory_now() -> datetime:
    """The bound clock's now (the plugin binds ``mnestoma_clock``), else the system's UTC now.

    Returns:
        An aware datetime in UTC.

    Raises:
        InvalidInput: the bound clock returned a naive datetime, or not a datetime.
    """
    clock = _binding.clock
    return ensure_aware_utc(clock() if clock is not None else datetime.now(UTC), "clock()")


def _days_before(now: datetime, days: float) -> datetime:
    return now - timedelta(days=days)


def _canonical(raw: str) -> str:
    return " ".join(raw.lower().split())


class _MnestomaFactory(SQLAlchemyModelFactory):
    """Common options: the bound session, flushed (never committed) on create."""

    class Meta:
        abstract = True
        sqlalchemy_session_factory = bound_session
        sqlalchemy_session_persistence = "flush"

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Any:
        # factory-boy stores the factory's session on _meta, where a closed session of an
        # earlier test would linger; ask for the bound one on every create instead.
        session_factory = cls._meta.sqlalchemy_session_factory
        if session_factory is None:  # a subclass's Meta unset it
            raise TypeError(f"{cls.__name__}.Meta.sqlalchemy_session_factory is None")
        return cls._save(model_class, session_factory(), args, kwargs)


class _SeenFactory(_MnestomaFactory):
    """Rows first seen ``first_seen_days_ago`` (14) and last seen ``last_seen_days_ago`` (1)
    days before the bound clock's now: the edges' and the chains' common params."""

    class Meta:
        abstract = True

    class Params:
        now = factory.LazyFunction(factory_now)
        last_seen_days_ago = 1.0
        first_seen_days_ago = 14.0

    ts_last = factory.LazyAttribute(lambda o: _days_before(o.now, o.last_seen_days_ago))
    ts_first = factory.LazyAttribute(
        lambda o: min(o.ts_last, _days_before(o.now, o.first_seen_days_ago))
    )


class MnestFactory(_SeenFactory):
    """An ``active``, versioned edge ``executor_N@1.0.0 → executor_N_next@1.0.0``.

    Params: ``last_seen_days_ago`` (ts_last = ts_weight = now − that), ``first_seen_days_ago``.
    Traits: ``strong`` (0.9, 12 uses, seen now), ``weak`` (0.12: the ager makes it decaying),
    ``old`` (last seen 120 days ago, weight 0.10), ``superseded``.
    """

    class Meta:
        model = Mnest

    class Params:
        strong = factory.Trait(weight=0.9, uses=12, last_seen_days_ago=0.0)
        weak = factory.Trait(weight=0.12, uses=1)
        old = factory.Trait(
            weight=0.10, uses=2, last_seen_days_ago=120.0, first_seen_days_ago=150.0
        )
        superseded = factory.Trait(state=MnestState.SUPERSEDED.value)

    id = factory.LazyFunction(new_mnest_id)
    src_executor = factory.Sequence(lambda n: f"executor_{n}")
    src_version = "1.0.0"
    dst_executor = factory.Sequence(lambda n: f"executor_{n}_next")
    dst_version: Any = "1.0.0"
    weight = 0.45
    uses = 2
    ts_weight = factory.SelfAttribute("ts_last")
    decay_lambda = DEFAULT_DECAY_LAMBDA
    # its uses spread evenly from ts_first to ts_last, as revision 0010 fills older rows
    decayed_uses = factory.LazyAttribute(
        lambda o: spread_count(o.uses, o.decay_lambda, o.ts_first, o.ts_last)
    )
    state = MnestState.ACTIVE.value
    tags: Any = None
    desired_sig: Any = None


class ProtoMnestFactory(MnestFactory):
    """A proto: ``dst_version`` NULL, state ``proto``, a ``desired_sig`` for the missing tool.

    Traits: ``recurring`` (4 uses, weight 0.45 now: listed by ``recurring_protos()``),
    ``old`` (weight 0.08, 120 days: the ager prunes it).
    """

    class Params:
        recurring = factory.Trait(weight=0.45, uses=4, last_seen_days_ago=0.0)
        old = factory.Trait(
            weight=0.08, uses=1, last_seen_days_ago=120.0, first_seen_days_ago=150.0
        )

    dst_executor = factory.Sequence(lambda n: f"missing_executor_{n}")
    dst_version = None
    weight = INITIAL_WEIGHT
    uses = 1
    state = MnestState.PROTO.value
    desired_sig = factory.LazyAttribute(
        lambda o: {
            "summary": f"turn the output of {o.src_executor} into what {o.dst_executor} needs",
            "inputs": [f"{o.src_executor}.output"],
            "outputs": [f"{o.dst_executor}.result"],
            "errors": ["InvalidInput"],
        }
    )


class DecayingMnestFactory(MnestFactory):
    """A ``decaying`` edge (weight 0.15). Trait ``old``: weight 0.04, last seen 120 days ago,
    so ``apply_ager()`` counts it as an archive candidate."""

    class Params:
        old = factory.Trait(
            weight=0.04, uses=3, last_seen_days_ago=120.0, first_seen_days_ago=200.0
        )

    weight = 0.15
    uses = 3
    state = MnestState.DECAYING.value


_ACTIVE, _DECAYING, _PROTO = MnestState.ACTIVE, MnestState.DECAYING, MnestState.PROTO


def _event_trait(
    kind: EventKind,
    weight_before: float | None,
    weight_after: float | None,
    state_before: MnestState,
    **state_after: str | None,
) -> factory.Trait:
    """A trait of :class:`EventFactory`: an event of ``kind``, its weights and states (the
    state after the factory's own, active, unless ``state_after`` is given)."""
    return factory.Trait(
        kind=kind.value,
        weight_before=weight_before,
        weight_after=weight_after,
        state_before=state_before.value,
        **state_after,
    )


class EventFactory(_MnestomaFactory):
    """A ``created`` event of a mnest.

    Pass ``mnest=<Mnest>`` or ``mnest_id=...``; with neither, a :class:`MnestFactory` row is
    made for it (events have no foreign key: a ``mnest_id`` of a pruned row is fine).
    Traits: ``reinforced``, ``transition`` (active → decaying), ``promoted``, ``pruned``.
    """

    class Meta:
        model = Event

    class Params:
        mnest = None
        # kind, weight before and after, state before (and after, where not active)
        reinforced = _event_trait(EventKind.REINFORCED, INITIAL_WEIGHT, 0.45, _ACTIVE)
        transition = _event_trait(
            EventKind.TRANSITION, 0.19, 0.19, _ACTIVE, state_after=_DECAYING.value
        )
        promoted = _event_trait(EventKind.PROMOTED, 0.45, 0.45, _PROTO)
        pruned = _event_trait(EventKind.PRUNED, 0.04, None, _PROTO, state_after=None)

    # With neither mnest nor mnest_id given, a MnestFactory row is made (same strategy);
    # an explicit mnest_id overrides this declaration, so no row is made for nothing.
    mnest_id = factory.Maybe(
        "mnest",
        yes_declaration=factory.SelfAttribute("mnest.id"),
        no_declaration=factory.SubFactory(MnestFactory),
    )
    kind = EventKind.CREATED.value
    ts = factory.LazyFunction(factory_now)
    turn_id: Any = None
    weight_before: Any = None
    weight_after: Any = INITIAL_WEIGHT
    state_before: Any = None
    state_after: Any = MnestState.ACTIVE.value
    reason: Any = None
    related_id: Any = None

    @classmethod
    def _adjust_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        if isinstance(kwargs.get("mnest_id"), Mnest):
            kwargs["mnest_id"] = kwargs["mnest_id"].id
        return kwargs


class CanonicalQueryFactory(_MnestomaFactory):
    """One normalised request; ``canonical_hash`` is the SHA-256 hex of ``canonical_query``."""

    class Meta:
        model = CanonicalQuery

    ts = factory.LazyFunction(factory_now)
    turn_id = factory.Sequence(lambda n: f"turn-{n}")
    raw_query = factory.Sequence(lambda n: f"  Find flights to City {n}  ")
    canonical_query = factory.LazyAttribute(lambda o: _canonical(o.raw_query))
    canonical_hash = factory.LazyAttribute(
        lambda o: hashlib.sha256(o.canonical_query.encode("utf-8")).hexdigest()
    )


class MnestChainFactory(_SeenFactory):
    """A chain of the planner (``mnest_chains``): ``executor_N → executor_N_mid →
    executor_N_next`` by names, passed ``uses`` times (2) from 14 days ago to 1 day ago, its
    decayed count those passings spread evenly between the two (as the mnests' factories).

    Params: ``last_seen_days_ago``, ``first_seen_days_ago``. Trait ``faded``: passed once,
    200 days ago: its decayed count has faded below
    :data:`~mnestoma.rules.CHAIN_FORGET_BELOW`, so ``apply_ager()`` forgets it.
    """

    class Meta:
        model = MnestChain

    class Params:
        faded = factory.Trait(uses=1, last_seen_days_ago=200.0, first_seen_days_ago=200.0)

    prev_executor = factory.Sequence(lambda n: f"executor_{n}")
    src_executor = factory.Sequence(lambda n: f"executor_{n}_mid")
    dst_executor = factory.Sequence(lambda n: f"executor_{n}_next")
    uses = 2
    decayed_uses = factory.LazyAttribute(
        lambda o: spread_count(o.uses, CHAIN_DECAY_LAMBDA, o.ts_first, o.ts_last)
    )
