"""The host operations of the run's own shape: update handlers, query state and defers;
child workflows, continue-as-new and detached runs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Tracer

from engine.determinism import derived_uuid
from engine.errors import GuestFault, Refused
from engine.events import (
    AwaitAllChildrenEvent,
    AwaitAnyChildEvent,
    AwaitChildEvent,
    ChildWorkflowEvent,
    ContinueAsNewEvent,
    DeferEvent,
    PollChildEvent,
    RunDetachedEvent,
    UpdateHandlerEvent,
)
from engine.outcomes import ContinueAsNew, WaitCondition, WaitKind
from engine.session.replay import (
    ReplayCore,
    Reply,
    json_value,
    parse_string_list,
    require_storable,
)
from engine.status import AbiStatus, status_from_byte
from engine.storage import ChildOutcome, StartChild, StartDetached
from engine.tracing import CHILD_START, span_traceparent, status_label

PARENT_CLOSE_POLICIES = ("terminate", "abandon", "request_cancel")


def _child_json(run_id: str, outcome: ChildOutcome) -> dict[str, Any]:
    status = status_from_byte(outcome.status)
    entry: dict[str, Any] = {
        "run_id": run_id,
        "status": status.label if status is not None else str(outcome.status),
    }
    if outcome.status == AbiStatus.OK:
        entry["result"] = json_value(outcome.result)
    else:
        entry["error"] = outcome.error
    return entry


class ChildOps(ReplayCore):
    """Updates, defers, children and continue-as-new."""

    # --- updates, queries, defers ---

    def register_update_handler(self, export_name: str) -> int:
        if not self.backend.has_export(export_name):
            raise GuestFault("register_update_handler", f"the module has no export {export_name!r}")
        if self._match(UpdateHandlerEvent, (export_name,)) is None:
            self._record(
                UpdateHandlerEvent(step=self.step, ts=self._stamp(), export_name=export_name)
            )
        self._update_handlers.add(export_name)
        return 0

    def set_query_state(self, key: str, value: str) -> int:
        require_storable("set_query_state", "the key", key, is_json=False)
        require_storable("set_query_state", "the value", value)
        self.query_state[key] = value
        return 0

    def durable_defer(self, export_name: str) -> Reply:
        if not self.backend.has_export(export_name):
            raise GuestFault("durable_defer", f"the module has no export {export_name!r}")
        event = self._match(DeferEvent, (export_name,))
        if event is None:
            defer_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, self.step, "defer")
            event = self._record(
                DeferEvent(
                    step=self.step, ts=self._stamp(), export_name=export_name, defer_id=defer_id
                )
            )
        self._defers.append((event.defer_id, export_name))
        return Reply(AbiStatus.OK, event.defer_id)

    # --- children, continue-as-new, detached runs ---

    def child_workflow(self, name: str, input: str) -> Reply:
        return self.child_workflow_with_options(name, input, 0, 0, "")

    def child_workflow_with_options(
        self, name: str, input: str, version: int, priority: int, parent_close_policy: str
    ) -> Reply:
        policy = parent_close_policy or "terminate"
        if policy not in PARENT_CLOSE_POLICIES:
            return Reply(
                AbiStatus.PERMANENT,
                f"parent_close_policy must be one of {', '.join(PARENT_CLOSE_POLICIES)}, "
                f"not {policy!r}",
            )
        require_storable("child_workflow", "the input", input)
        version = max(0, int(version))
        event = self._match(ChildWorkflowEvent, (name, input, version, policy))
        if event is None:
            step, ts = self.step, self._stamp()
            run_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "child")

            def make(child_id: Any) -> ChildWorkflowEvent:
                return ChildWorkflowEvent(
                    step=step,
                    ts=ts,
                    name=name,
                    input=input,
                    version=version,
                    priority=int(priority),
                    parent_close_policy=policy,
                    run_id=str(child_id),
                )

            def refused(exc: Refused) -> ChildWorkflowEvent:
                return ChildWorkflowEvent(
                    step=step,
                    ts=ts,
                    name=name,
                    input=input,
                    version=version,
                    priority=int(priority),
                    parent_close_policy=policy,
                    status=exc.status,
                    error=exc.message,
                )

            mutation = StartChild(
                run_id, name, input, version, int(priority), policy, self.run.version
            )
            tracer = self.services.tracer
            if tracer is None:
                event = self._apply(mutation, make, refused)
            else:
                event = self._traced_child_start(tracer, mutation, make, refused)
        if event.status != AbiStatus.OK:
            return Reply(event.status, event.error)
        return Reply(AbiStatus.OK, event.run_id)

    def _traced_child_start(
        self,
        tracer: Tracer,
        mutation: StartChild,
        make: Callable[[Any], ChildWorkflowEvent],
        refused: Callable[[Refused], ChildWorkflowEvent],
    ) -> ChildWorkflowEvent:
        """Start the child inside a ``cleat.child_start`` span, which becomes the parent of
        the child's segments (its ``traceparent`` travels with the start)."""
        attributes: dict[str, str | int] = {
            "cleat.child.definition": mutation.name,
            "cleat.step": self.step,
        }
        with tracer.start_as_current_span(CHILD_START, attributes=attributes) as span:
            traced = dataclasses.replace(mutation, traceparent=span_traceparent(span) or "")
            event = self._apply(traced, make, refused)
            span.set_attribute("cleat.child.run_id", event.run_id)
            span.set_attribute("cleat.status", status_label(event.status))
            if event.status != AbiStatus.OK:
                span.set_status(trace.Status(trace.StatusCode.ERROR, event.error[:200]))
        return event

    def await_child(self, run_id: str) -> Reply:
        event = self._match(AwaitChildEvent, (run_id,))
        if event is None:
            if self._blocking_preamble() is not None:
                outcome = ChildOutcome(
                    AbiStatus.CANCELLED, error="cancelled while awaiting a child"
                )
            else:
                [found] = self.storage.child_outcomes(self.ref, [run_id])
                if found is None:
                    raise self._suspend(WaitCondition(WaitKind.CHILD, run_ids=(run_id,)))
                outcome = found
            event = self._record(
                AwaitChildEvent(
                    step=self.step,
                    ts=self._stamp(),
                    run_id=run_id,
                    status=outcome.status,
                    result=outcome.result,
                    error=outcome.error,
                )
            )
        if event.status == AbiStatus.OK:
            return Reply(AbiStatus.OK, event.result)
        return Reply(event.status, event.error)

    def poll_child(self, run_id: str) -> Reply:
        event = self._match(PollChildEvent, (run_id,))
        if event is None:
            [found] = self.storage.child_outcomes(self.ref, [run_id])
            outcome = found or ChildOutcome(AbiStatus.NOT_FOUND)
            event = self._record(
                PollChildEvent(
                    step=self.step,
                    ts=self._stamp(),
                    run_id=run_id,
                    status=outcome.status,
                    result=outcome.result,
                    error=outcome.error,
                )
            )
        if event.status == AbiStatus.OK:
            return Reply(AbiStatus.OK, event.result)
        return Reply(event.status, event.error)

    def await_all_children(self, run_ids_json: str) -> Reply:
        run_ids = parse_string_list(run_ids_json)
        if run_ids is None:
            return Reply(AbiStatus.PERMANENT, "run_ids must be a JSON array of strings")
        event = self._match(AwaitAllChildrenEvent, (run_ids,))
        if event is None:
            if self._blocking_preamble() is not None:
                event = self._record(
                    AwaitAllChildrenEvent(
                        step=self.step,
                        ts=self._stamp(),
                        run_ids=run_ids,
                        status=AbiStatus.CANCELLED,
                    )
                )
            else:
                read = self.storage.child_outcomes(self.ref, run_ids)
                outcomes = list(zip(run_ids, read, strict=True))
                waiting = tuple(rid for rid, o in outcomes if o is None)
                if waiting:
                    raise self._suspend(WaitCondition(WaitKind.CHILDREN, run_ids=waiting))
                body = [_child_json(rid, o) for rid, o in outcomes if o is not None]
                event = self._record(
                    AwaitAllChildrenEvent(
                        step=self.step,
                        ts=self._stamp(),
                        run_ids=run_ids,
                        outcomes=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
                    )
                )
        return Reply(event.status, event.outcomes)

    def await_any_child(self, run_ids_json: str) -> Reply:
        run_ids = parse_string_list(run_ids_json)
        if not run_ids:
            return Reply(AbiStatus.PERMANENT, "run_ids must be a non-empty JSON array of strings")
        event = self._match(AwaitAnyChildEvent, (run_ids,))
        if event is None:
            if self._blocking_preamble() is not None:
                event = self._record(
                    AwaitAnyChildEvent(
                        step=self.step,
                        ts=self._stamp(),
                        run_ids=run_ids,
                        status=AbiStatus.CANCELLED,
                    )
                )
            else:
                read = self.storage.child_outcomes(self.ref, run_ids)
                for rid, found in zip(run_ids, read, strict=True):
                    if found is not None:
                        body = _child_json(rid, found)
                        event = self._record(
                            AwaitAnyChildEvent(
                                step=self.step,
                                ts=self._stamp(),
                                run_ids=run_ids,
                                outcome=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
                            )
                        )
                        break
                else:
                    raise self._suspend(WaitCondition(WaitKind.ANY_CHILD, run_ids=run_ids))
        return Reply(event.status, event.outcome)

    def continue_as_new(self, new_input: str) -> int:
        return self.continue_as_new_with_version(new_input, 0)

    def continue_as_new_with_version(self, new_input: str, version: int) -> int:
        require_storable("continue_as_new", "the new input", new_input)
        version = max(0, int(version))
        if self._match(ContinueAsNewEvent, (new_input, version)) is None:
            self._record(
                ContinueAsNewEvent(
                    step=self.step, ts=self._stamp(), new_input=new_input, new_version=version
                )
            )
        raise ContinueAsNew(new_input, version)

    def run_detached(self, name: str, input: str) -> Reply:
        require_storable("run_detached", "the input", input)
        event = self._match(RunDetachedEvent, (name, input))
        if event is None:
            step, ts = self.step, self._stamp()
            run_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "detached")
            event = self._apply(
                StartDetached(run_id, name, input),
                lambda rid: RunDetachedEvent(
                    step=step, ts=ts, name=name, input=input, run_id=str(rid)
                ),
                lambda exc: RunDetachedEvent(
                    step=step, ts=ts, name=name, input=input, status=exc.status, error=exc.message
                ),
            )
        if event.status != AbiStatus.OK:
            return Reply(event.status, event.error)
        return Reply(AbiStatus.OK, event.run_id)
