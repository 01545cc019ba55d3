"""The state changes of a repository: ``transition_state`` and ``promote_proto_to_active``
(contract §4), each on a row locked for the change, with its event."""

from __future__ import annotations

from typing import Any

from mnestoma.core.errors import ConflictError, InvalidInput, InvalidTransition, NotFound
from mnestoma.core.rules import EventKind, MnestState, advance, check_transition, decayed_weight
from mnestoma.core.validation import check_mnest_id, check_name, check_state, check_text, shorten
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import Mnest
from mnestoma.schema.runner import StatementRunner
from mnestoma.schema.sql import record as rec
from mnestoma.store.plumbing import StoreBase
from mnestoma.store.rows import MnestRow, event_values, key_params

__all__ = ["StateCommands"]


class StateCommands(StoreBase):
    """The state changes of :class:`~mnestoma.MnestRepository` (contract §4)."""

    def _locked(self, ex: StatementRunner, mnest_id: Any) -> MnestRow:
        if not check_mnest_id(mnest_id):
            raise InvalidInput("mnest_id must be a non-empty string")
        row = ex.first(rec.SELECT_BY_ID_LOCKED, {"id": mnest_id})
        if row is None:
            raise NotFound(f"no mnest with id {shorten(mnest_id)!r}")
        return MnestRow._make(row)

    def _key_taken(
        self, ex: StatementRunner, row: MnestRow, state: MnestState, dst_version: str | None
    ) -> bool:
        """Does another row hold this row's key (with ``dst_version``) in ``state``?"""
        key = (row.src_executor, row.src_version, row.dst_executor, dst_version)
        params = {**key_params(key), "own_id": row.id}
        return ex.first(rec.key_taken(dst_version is None, state), params) is not None

    def transition_state(
        self, mnest_id: str, new_state: str, *, reason: str | None = None
    ) -> Mnest:
        """Move a row to another state, with a ``transition`` event (same state: no-op).

        Returns:
            The row in its new state (as it was, when it was in that state already).

        Raises:
            InvalidInput: ``mnest_id``, ``new_state`` or ``reason`` is refused.
            NotFound: no mnest has this id.
            InvalidTransition: the contract's transition table does not allow the change.
            ConflictError: another row of the same key is in ``new_state`` already, or the
                write lock was not had within the lock timeout.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        target = check_state(new_state)
        if reason is not None:
            reason = check_text(reason, "reason", max_length=2_000)
        ex = self._write_ex()
        row = self._locked(ex, mnest_id)
        current = MnestState(row.state)
        if current == target:
            return snap.mnest(row)
        why = check_transition(current, target, has_version=row.dst_version is not None)
        if why is not None:
            raise InvalidTransition(why)
        if self._key_taken(ex, row, target, row.dst_version):
            raise ConflictError(
                f"a {target.value} row with the same key as {row.id} already exists"
            )
        ex.many(rec.SET_STATE, [{"b_id": row.id, "b_state": target.value}])
        self._record_change(ex, row, target, EventKind.TRANSITION, reason=reason)
        return snap.mnest(row._replace(state=target.value))

    def promote_proto_to_active(self, mnest_id: str, dst_version: str) -> Mnest:
        """Give a proto its destination version and make it active (event ``promoted``).

        Returns:
            The row, now active with ``dst_version``.

        Raises:
            InvalidInput: ``mnest_id`` or ``dst_version`` is refused.
            NotFound: no mnest has this id.
            InvalidTransition: the row is not a proto.
            ConflictError: an active edge with the same key and ``dst_version`` exists, or
                the write lock was not had within the lock timeout.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        version = check_name(dst_version, "dst_version")
        ex = self._write_ex()
        row = self._locked(ex, mnest_id)
        if row.state != MnestState.PROTO:
            raise InvalidTransition(f"{row.id} is {row.state}, not a proto")
        if self._key_taken(ex, row, MnestState.ACTIVE, version):
            raise ConflictError(
                f"an active edge {row.src_executor}@{row.src_version} -> "
                f"{row.dst_executor}@{version} already exists"
            )
        target = MnestState.ACTIVE
        ex.many(rec.PROMOTE, [{"b_id": row.id, "b_state": target.value, "b_dst_version": version}])
        self._record_change(ex, row, target, EventKind.PROMOTED)
        return snap.mnest(row._replace(dst_version=version, desired_sig=None, state=target.value))

    def _record_change(
        self,
        ex: StatementRunner,
        row: MnestRow,
        target: MnestState,
        kind: EventKind,
        *,
        reason: str | None = None,
    ) -> None:
        """The event of a state change of a locked row; the weight is untouched."""
        now = advance(row.ts_last, self._write_now(ex))
        eff = decayed_weight(row.weight, row.decay_lambda, row.ts_weight, now)
        event_row = event_values(
            row.id,
            kind,
            now,
            weight_before=eff,
            weight_after=eff,
            state_before=row.state,
            state_after=target.value,
            reason=reason,
            recorder=self.settings.recorder,
        )
        ex.many(rec.INSERT_EVENT, [event_row], rec.EVENT_ROW)
