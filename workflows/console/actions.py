"""The operator's run actions: one form and one service call each.

Every action, single or bulk, goes through a confirmation page (``views``) that shows the runs
with the **generation** they had when the page was drawn, asks for a **reason**, and then
calls the service. A run whose generation has moved on since (a worker claimed it, another
operator acted) is refused with "reload and try again" instead of being acted on blindly.

``force_complete``, ``force_fail`` and ``re_replay`` check the generation in the service
itself. For the others the service takes no generation, so :func:`perform` locks the run,
compares the generation and calls the service in **one transaction**: nothing can move the
run in between (row lock on PostgreSQL and MariaDB, the write lock on SQLite).

Audit: the services write the ``AuditLog`` row (and, for terminate, retry, force-complete,
force-fail and re-replay, an ``admin_action`` event in the run's history) in the same
transaction as the change.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django import forms

from engine import lifecycle
from engine.errors import ErrorCode
from engine.storable import json_text_fault
from workflows import services as svc
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context


class JSONTextField(forms.CharField):
    """A JSON document typed by an operator; the error says where it stops parsing."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 60, "class": "vLargeTextField"})

    def clean(self, value: Any) -> str:
        text = super().clean(value)
        if not text:
            return "null"
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})",
                code="json",
            ) from None
        except RecursionError:
            raise forms.ValidationError("nested too deeply to be read", code="json") from None
        fault = json_text_fault(text)
        if fault is not None:
            raise forms.ValidationError(f"The JSON {fault}.", code="json")
        return text


class ActionForm(forms.Form):
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Why: kept in the audit log (and in the run's history for most actions).",
    )


class RetryForm(ActionForm):
    mode = forms.ChoiceField(
        choices=[
            (
                lifecycle.RETRY_REPLAY,
                "Replay the history (a last call that failed retryably is made again)",
            ),
            (
                lifecycle.RETRY_REEXECUTE_LAST_CALL,
                "Re-execute the last call, even if it failed permanently",
            ),
        ],
        initial=lifecycle.RETRY_REPLAY,
        required=False,
        widget=forms.RadioSelect,
        help_text="A run that failed because a service was configured wrongly replays that "
        "recorded failure and fails again: once the configuration is fixed, re-execute the "
        "last call.",
    )


class ForceCompleteForm(ActionForm):
    result = JSONTextField(
        required=False,
        initial="null",
        help_text="The run's result, as JSON (what its caller or parent will receive).",
    )


class ForceFailForm(ActionForm):
    message = forms.CharField(max_length=2000, help_text="The error message the run ends with.")
    code = forms.ChoiceField(
        choices=[(c.value, c.value) for c in ErrorCode],
        initial=ErrorCode.ERROR.value,
        help_text="The error code the run ends with.",
    )


class SignalForm(ActionForm):
    name = forms.CharField(max_length=256, help_text="The signal's name, e.g. approve.")
    payload = JSONTextField(required=False, initial="null", help_text="Its payload, as JSON.")


Performer = Callable[[Tenant, str, int, dict[str, Any], str], WorkflowInstance | Any]


@dataclass(frozen=True)
class RunAction:
    name: str
    label: str
    help: str  # what it does and when to use it (shown on the confirmation page)
    form_class: type[forms.Form]
    offered_for: frozenset[str]  # statuses the instance page offers it for (the service decides)
    call: Performer
    generation_in_service: bool = False
    danger: bool = False

    @property
    def done_text(self) -> str:
        return {
            "force_complete": "force-completed",
            "force_fail": "force-failed",
            "retry": "retried",
            "terminate": "terminated",
            "cancel": "asked to cancel",
            "pause": "paused",
            "resume": "resumed",
            "re_replay": "set to re-replay",
            "signal": "signalled",
        }[self.name]


def _force_complete(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.force_complete(t, run, gen, data["result"], op, data["reason"])


def _force_fail(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.force_fail(t, run, gen, data["message"], data["code"], op, data["reason"])


def _re_replay(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.re_replay(t, run, gen, op, data["reason"])


def _retry(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.retry_workflow(
        t, run, operator=op, reason=data["reason"], mode=data.get("mode") or "replay"
    )


def _terminate(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.terminate_workflow(t, run, reason=data["reason"], operator=op)


def _cancel(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.cancel_workflow(t, run, reason=data["reason"], operator=op)


def _pause(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.pause_workflow(t, run, operator=op, reason=data["reason"])


def _resume(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.resume_workflow(t, run, operator=op, reason=data["reason"])


def _signal(t: Tenant, run: str, gen: int, data: dict[str, Any], op: str) -> Any:
    return svc.signal_workflow(
        t,
        run,
        data["name"],
        data["payload"],
        operator=op,
        reason=data["reason"],
        permitted=bool(data.get("may_signal")),
        caller=op,
    )


_ACTIVE = frozenset({RunStatus.READY, RunStatus.RUNNING, RunStatus.PAUSED})
_CLOSED_BADLY = frozenset({RunStatus.FAILED, RunStatus.DEAD_LETTERED})

ACTIONS: dict[str, RunAction] = {
    a.name: a
    for a in (
        RunAction(
            "retry",
            "Retry",
            "Moves a failed or dead-lettered run back to ready with its attempts reset; a "
            "worker replays its history and carries on from where it stopped. Use it once the "
            "cause (a service outage, a bug fixed in a new version) is gone.",
            RetryForm,
            _CLOSED_BADLY,
            _retry,
        ),
        RunAction(
            "re_replay",
            "Re-replay",
            "Sets a settled run back to ready so a worker re-executes it from its existing "
            "history (nothing recorded is called again). Use it after deploying a fix for a "
            "non-determinism or to re-derive the query state.",
            ActionForm,
            frozenset({RunStatus.READY, RunStatus.DONE, *_CLOSED_BADLY, RunStatus.TERMINATED}),
            _re_replay,
            generation_in_service=True,
        ),
        RunAction(
            "signal",
            "Send signal",
            "Delivers a signal to the run, as a client would; a run waiting for it wakes up. "
            "Use it to unblock a run whose sender is gone.",
            SignalForm,
            _ACTIVE,
            _signal,
        ),
        RunAction(
            "pause",
            "Pause",
            "Stops a ready run from being claimed (it keeps its place and everything it waits "
            "for). Use it to hold a run while you investigate.",
            ActionForm,
            frozenset({RunStatus.READY}),
            _pause,
        ),
        RunAction(
            "resume",
            "Resume",
            "Makes a paused run ready and due again.",
            ActionForm,
            frozenset({RunStatus.PAUSED}),
            _resume,
        ),
        RunAction(
            "cancel",
            "Cancel",
            "Asks the run to cancel: its next blocking call returns CANCELLED and the workflow "
            "decides how to wind down (compensations, defers). The polite way to stop a run.",
            ActionForm,
            _ACTIVE,
            _cancel,
        ),
        RunAction(
            "terminate",
            "Terminate",
            "Ends the run at once as terminated, without running any of its code; its "
            "children follow their parent-close policy. Use it when cancelling is not enough.",
            ActionForm,
            _ACTIVE,
            _terminate,
            danger=True,
        ),
        RunAction(
            "force_complete",
            "Force-complete",
            "Ends the run as done with the result you give, without running its code (its "
            "parent receives that result). Use it when the work was finished by hand.",
            ForceCompleteForm,
            frozenset({*_ACTIVE, *_CLOSED_BADLY, RunStatus.TERMINATED}),
            _force_complete,
            generation_in_service=True,
            danger=True,
        ),
        RunAction(
            "force_fail",
            "Force-fail",
            "Ends the run as failed with your message and error code, without running its "
            "code. Use it to give up on a run that can never succeed.",
            ForceFailForm,
            _ACTIVE,
            _force_fail,
            generation_in_service=True,
            danger=True,
        ),
    )
}


@dataclass(frozen=True)
class Target:
    run_id: str
    generation: int


@dataclass(frozen=True)
class Outcome:
    run_id: str
    ok: bool
    message: str


def parse_targets(values: Iterable[str]) -> list[Target]:
    """``run_id:generation`` pairs from the confirmation page's hidden fields."""
    targets: list[Target] = []
    for value in values:
        run, _, generation = str(value).partition(":")
        try:
            targets.append(Target(str(uuid.UUID(run)), int(generation)))
        except ValueError:
            raise svc.InvalidInput(f"malformed run reference {value!r}", "runs") from None
    return targets


def perform(
    action: RunAction,
    tenant: Tenant,
    targets: Sequence[Target],
    data: dict[str, Any],
    operator: str,
) -> list[Outcome]:
    """Apply ``action`` to each target in its own transaction: one run's refusal (stale
    generation, illegal transition) leaves the others' changes standing."""
    outcomes: list[Outcome] = []
    for target in targets:
        try:
            with tenant_context(tenant.id):
                if not action.generation_in_service:
                    _require_generation(tenant, target)
                done = action.call(tenant, target.run_id, target.generation, data, operator)
        except svc.ServiceError as exc:
            svc.keep_refusal_audit(tenant, exc)  # a policy's refusal keeps its audit row
            outcomes.append(Outcome(target.run_id, False, exc.message))
        else:
            plan = getattr(done, "retry_plan", None)
            detail = f": {plan.effect}" if plan is not None else ""
            outcomes.append(Outcome(target.run_id, True, action.done_text + detail))
    return outcomes


def _require_generation(tenant: Tenant, target: Target) -> None:
    instance = svc.get_instance(tenant, target.run_id, lock=True)
    if instance.generation != target.generation:
        raise svc.Conflict(
            f"run {target.run_id} moved on (generation {instance.generation}, the page showed "
            f"{target.generation}): reload it and try again",
            "generation",
        )
