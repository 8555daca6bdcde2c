"""The host operations on cleat's own data: state and scopes, locks, cron schedules."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from engine.determinism import derived_uuid
from engine.errors import GuestFault, QuotaExceeded, Refused
from engine.events import (
    AcquireLockEvent,
    DeleteCronEvent,
    ListCronsEvent,
    ReleaseLockEvent,
    ScheduleCronEvent,
    ScopeAcquiredEvent,
    StateMutationEvent,
)
from engine.session.replay import (
    ReplayCore,
    Reply,
    compact_json,
    event_fields,
    never_refused,
    require_storable,
)
from engine.status import AbiStatus
from engine.storage import (
    AcquireLock,
    CreateSchedule,
    DeleteSchedule,
    DeleteState,
    IncrState,
    ReleaseLock,
    SetState,
)


class StateOps(ReplayCore):
    """State, locks and crons: each change goes through ``storage.apply`` with its event."""

    # --- state, scopes, locks ---

    def _state_event(
        self, op: str, key: str, value: str = "", delta: int = 0, **answer: Any
    ) -> Any:
        return StateMutationEvent(
            step=self.step,
            ts=self._stamp(),
            op=op,
            key=key,
            value=value,
            delta=delta,
            scope=self.scope,
            **answer,
        )

    def set_state(self, key: str, value: str) -> int:
        require_storable("set_state", "the key", key, is_json=False)
        require_storable("set_state", "the value", value, is_json=False)
        if self._match(StateMutationEvent, ("set", key, value, 0)) is None:
            event = self._state_event("set", key, value)
            self._apply(SetState(self.scope, key, value), lambda _: event, never_refused)
        return 0

    def get_state(self, key: str) -> Reply:
        event = self._match(StateMutationEvent, ("get", key, "", 0))
        if event is None:
            value = self.storage.get_state(self.ref, self.scope, key)
            event = self._record(
                self._state_event("get", key, result=value or "", found=value is not None)
            )
        if not event.found:
            return Reply(AbiStatus.NOT_FOUND, "")
        return Reply(AbiStatus.OK, event.result)

    def delete_state(self, key: str) -> int:
        event = self._match(StateMutationEvent, ("delete", key, "", 0))
        if event is None:
            step_event = self._state_event("delete", key)
            event = self._apply(
                DeleteState(self.scope, key),
                lambda existed: StateMutationEvent(
                    **{**event_fields(step_event), "found": bool(existed)}
                ),
                never_refused,
            )
        return 1 if event.found else 0

    def incr_state(self, key: str, delta: int) -> int:
        delta = int(delta)
        event = self._match(StateMutationEvent, ("incr", key, "", delta))
        if event is None:
            step_event = self._state_event("incr", key, delta=delta)

            def refused(exc: Refused) -> StateMutationEvent:
                raise GuestFault("incr_state", exc.message)

            event = self._apply(
                IncrState(self.scope, key, delta),
                lambda new: StateMutationEvent(**{**event_fields(step_event), "result": str(new)}),
                refused,
            )
        return int(event.result)

    def has_state(self, key: str) -> int:
        event = self._match(StateMutationEvent, ("has", key, "", 0))
        if event is None:
            found = self.storage.get_state(self.ref, self.scope, key) is not None
            event = self._record(self._state_event("has", key, found=found))
        return 1 if event.found else 0

    def list_state(self, prefix: str) -> Reply:
        event = self._match(StateMutationEvent, ("list", prefix, "", 0))
        if event is None:
            keys = sorted(self.storage.list_state(self.ref, self.scope, prefix))
            event = self._record(self._state_event("list", prefix, result=compact_json(keys)))
        return Reply(AbiStatus.OK, event.result)

    def set_scope(self, object_type: str, instance_key: str) -> Reply:
        previous = self._scope_json()
        if self._match(ScopeAcquiredEvent, (object_type, instance_key)) is None:
            self._record(
                ScopeAcquiredEvent(
                    step=self.step,
                    ts=self._stamp(),
                    object_type=object_type,
                    instance_key=instance_key,
                    previous=previous,
                )
            )
        if object_type:
            self._scope = f"obj:{object_type}:{instance_key}"
            self._scope_object = (object_type, instance_key)
        else:
            self._scope = ""
            self._scope_object = ("", "")
        return Reply(AbiStatus.OK, previous)

    def get_scope(self) -> Reply:
        return Reply(AbiStatus.OK, self._scope_json())

    def _scope_json(self) -> str:
        return compact_json(
            {"object_type": self._scope_object[0], "instance_key": self._scope_object[1]}
        )

    def acquire_lock(self, key: str, ttl_ms: int) -> int:
        ttl_ms = max(0, int(ttl_ms))
        event = self._match(AcquireLockEvent, (key, ttl_ms))
        if event is None:
            step, ts = self.step, self._stamp()
            event = self._apply(
                AcquireLock(key, self.ref.workflow_id, ttl_ms, self.clock()),
                lambda acquired: AcquireLockEvent(
                    step=step, ts=ts, key=key, ttl_ms=ttl_ms, acquired=bool(acquired)
                ),
                _over_lock_quota,
            )
        return 1 if event.acquired else 0

    def release_lock(self, key: str) -> int:
        if self._match(ReleaseLockEvent, (key,)) is None:
            step, ts = self.step, self._stamp()
            self._apply(
                ReleaseLock(key, self.ref.workflow_id),
                lambda _: ReleaseLockEvent(step=step, ts=ts, key=key),
                never_refused,
            )
        return 0

    # --- schedules ---

    def schedule_cron(self, workflow_name: str, cron: str, timezone: str, input: str) -> Reply:
        require_storable("schedule_cron", "the input", input)
        event = self._match(ScheduleCronEvent, (workflow_name, cron, timezone, input))
        if event is None:
            step, ts = self.step, self._stamp()
            schedule_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "schedule")
            base = ScheduleCronEvent(
                step=step,
                ts=ts,
                workflow_name=workflow_name,
                cron=cron,
                timezone=timezone,
                input=input,
            )
            event = self._apply(
                CreateSchedule(schedule_id, workflow_name, cron, timezone or "UTC", input),
                lambda sid: dataclasses.replace(base, schedule_id=str(sid)),
                lambda exc: dataclasses.replace(base, status=exc.status, error=exc.message),
            )
        if event.status != AbiStatus.OK:
            return Reply(event.status, event.error)
        return Reply(AbiStatus.OK, event.schedule_id)

    def delete_cron(self, schedule_id: str) -> Reply:
        event = self._match(DeleteCronEvent, (schedule_id,))
        if event is None:
            step, ts = self.step, self._stamp()
            event = self._apply(
                DeleteSchedule(schedule_id),
                lambda _: DeleteCronEvent(step=step, ts=ts, schedule_id=schedule_id),
                lambda exc: DeleteCronEvent(
                    step=step, ts=ts, schedule_id=schedule_id, status=exc.status
                ),
            )
        return Reply(event.status, "")

    def list_crons(self) -> Reply:
        event = self._match(ListCronsEvent, ())
        if event is None:
            schedules = self.storage.list_schedules(self.ref)
            event = self._record(
                ListCronsEvent(
                    step=self.step,
                    ts=self._stamp(),
                    result=json.dumps(schedules, separators=(",", ":"), ensure_ascii=False),
                )
            )
        return Reply(AbiStatus.OK, event.result)


def _over_lock_quota(exc: Refused) -> Any:
    """``acquire_lock`` answers 1 or 0, so the locks quota (DENIED) fails the run instead."""
    if exc.status == AbiStatus.DENIED:
        raise QuotaExceeded(exc.message)
    return never_refused(exc)
