"""The console's pages. Each runs inside the request's tenant context (the middleware) and
reads only that tenant's rows; every change is a call to ``workflows.services`` or
``workflows.definitions`` whose refusal (``ServiceError``) becomes a message or a form
error, never a server error."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Max, Min, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.utils.safestring import mark_safe

from engine import lifecycle
from engine.compaction import CompactionCorrupt
from engine.events import CodecError, EncodedEvent, decode, verify
from workflows import definitions as defs
from workflows import services as svc
from workflows import timeline
from workflows.console import charts, metrics
from workflows.console.actions import ACTIONS, JSONTextField, RunAction, parse_targets, perform
from workflows.console.display import (
    STATUS_COLOURS,
    age_text,
    duration_text,
    pretty_json,
    wait_text,
)
from workflows.console.forms import DeployForm, RoutingForm, TagForm
from workflows.console.replay import state_at_step
from workflows.console.scoping import request_tenant
from workflows.crypto import EncryptionKeyMissing, shown_column
from workflows.middleware import SESSION_KEY
from workflows.models import (
    ACTIVE_STATUSES,
    STALE_AFTER_BEATS,
    AuditLog,
    RunStatus,
    Signal,
    Tenant,
    VersionTag,
    WorkerProcess,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    checkpoint_state,
    continue_chain,
)
from workflows.redaction import (
    readable_payload,
    redacted_query_state,
    redacted_text,
    redacted_value,
)
from workflows.store.backlog import backlog
from workflows.store.workers import fleet_now
from workflows.tenancy import of_tenant

EVENTS_PER_PAGE = 50
MAX_BULK = 500
CHAIN_LIMIT = 50
OPERATE_PERMISSION = "workflows.change_workflowinstance"


tenant_of = request_tenant  # the request's console tenant (set by the middleware)


def operator_of(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def can_operate(request: HttpRequest) -> bool:
    return bool(request.user.has_perm(OPERATE_PERMISSION))


def _render(
    request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
) -> TemplateResponse:
    base = admin.site.each_context(request)
    base.update(
        {
            "cleat_tenant": tenant_of(request),
            "status_colours": STATUS_COLOURS,
            "opts": WorkflowInstance._meta,
        }
    )
    base.update(context)
    return TemplateResponse(request, template, base, status=status)


def instance_url(run_id: Any) -> str:
    return reverse("admin:workflows_workflowinstance_change", args=[str(run_id)])


def changelist_url() -> str:
    return reverse("admin:workflows_workflowinstance_changelist")


def _instance_or_404(request: HttpRequest, object_id: str) -> WorkflowInstance:
    """The console tenant's run ``object_id``; 404 for any other id (another tenant's run
    included: the answer must not tell the two apart)."""
    try:
        run_id = UUID(str(object_id))
    except ValueError:
        raise Http404(f"No workflow run {object_id!r} in this tenant.") from None
    found = (
        of_tenant(WorkflowInstance, tenant_of(request))
        .filter(id=run_id)
        .select_related("parent", "continued_from")
        .first()
    )
    if found is None:
        raise Http404(f"No workflow run {object_id!r} in this tenant.")
    return found


# --- the instance page -------------------------------------------------------------------------


def _history(instance: WorkflowInstance) -> list[EncodedEvent]:
    """The whole history (the compaction checkpoint expanded); only the rows when the
    checkpoint cannot be read (the page says so: :func:`_compaction_note`)."""
    try:
        return WorkflowEvent.history(instance.tenant_id, instance.id)
    except CompactionCorrupt:
        return WorkflowEvent.rows(instance.tenant_id, instance.id)


def _compaction_note(instance: WorkflowInstance) -> str:
    """What the page says about a compacted prefix ("steps 0-999 compacted ...")."""
    marker = instance.compaction_marker
    if marker is None:
        return ""
    try:
        checkpoint_state(instance.compaction_state)
    except (CompactionCorrupt, EncryptionKeyMissing) as exc:
        return f"{marker}; the checkpoint cannot be read ({exc}): only the later events are shown"
    return f"{marker}: kept in the run's checkpoint, shown here expanded"


def timeline_svg(instance: WorkflowInstance, history: list[EncodedEvent] | None = None) -> str:
    now = timezone.now()
    end = timeline.RunEnd(
        status=instance.status,
        at_ms=int(instance.completed_at.timestamp() * 1000) if instance.completed_at else None,
        now_ms=int(now.timestamp() * 1000),
        error_code=instance.error_code or "",
        waiting=wait_text(instance.waiting_on, now) if not instance.is_terminal else "",
    )
    return timeline.render(
        history if history is not None else _history(instance),
        int(instance.created_at.timestamp() * 1000),
        end,
        title=f"{instance.definition_name} v{instance.definition_version} run {instance.id}",
    )


def _event_rows(page_rows: list[EncodedEvent], start_ms: int) -> list[dict[str, Any]]:
    rows = []
    for stored in page_rows:
        try:
            event = decode(stored)
            kind, summary = event.TYPE.value, event.describe()
        except CodecError as exc:
            kind, summary = f"code {stored.type_code}", f"undecodable: {exc}"
        rows.append(
            {
                "step": stored.step,
                "type": kind,
                "summary": redacted_text(summary),
                "payload": readable_payload(stored.payload),
                "offset": duration_text(max(0, stored.ts - start_ms) / 1000),
                "at": datetime.fromtimestamp(stored.ts / 1000, UTC),
                "checksum_ok": verify(stored),
                "pending": not stored.checksum,
            }
        )
    return rows


def _chain(instance: WorkflowInstance) -> list[WorkflowInstance]:
    """The continue-as-new chain through this run, oldest first (bounded both ways)."""
    before = continue_chain(instance, limit=CHAIN_LIMIT, backward=True)
    after = continue_chain(instance, limit=CHAIN_LIMIT)
    if not before and not after:
        return []
    return [*reversed(before), instance, *after]


def _query_state_rows(query_state: Any) -> list[tuple[str, str]]:
    """The run's query state as (key, JSON text) rows, redacted like the API's."""
    return [
        (key, json.dumps(value, ensure_ascii=False))
        for key, value in sorted(redacted_query_state(query_state).items())
    ]


def instance_page(request: HttpRequest, object_id: str) -> HttpResponse:
    instance = _instance_or_404(request, object_id)
    history = _history(instance)
    start_ms = int(instance.created_at.timestamp() * 1000)
    paginator = Paginator(history, EVENTS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    children = (
        of_tenant(WorkflowInstance, instance.tenant_id)
        .filter(parent_id=instance.id)
        .order_by("created_at")
    )
    offered = [
        a for a in ACTIONS.values() if instance.status in a.offered_for and can_operate(request)
    ]
    context = {
        "title": f"Run {instance.id}",
        "instance": instance,
        "wait": wait_text(instance.waiting_on),
        "age": age_text(instance.created_at),
        "input_text": pretty_json(redacted_text(instance.input)),
        "result_text": pretty_json(redacted_text(instance.result)),
        "query_state": _query_state_rows(instance.query_state),
        "children": children[:100],
        "children_count": children.count(),
        "chain": _chain(instance),
        "audit": of_tenant(AuditLog, instance.tenant_id).filter(instance_id=instance.id)[:50],
        "pending_signals": of_tenant(Signal, instance.tenant_id).filter(
            instance_id=instance.id, consumed_at__isnull=True
        )[:20],
        "actions": offered,
        "timeline": mark_safe(timeline_svg(instance, history)),
        "events_page": page,
        "events": _event_rows(list(page.object_list), start_ms),
        "event_total": len(history),
        "compaction_note": _compaction_note(instance),
        "state_step": len(history),
        "worker_url": workers_url(instance.assigned_to)
        if instance.assigned_to and can_see_workers(request)
        else "",
    }
    return _render(request, "console/instance.html", context)


def timeline_download(request: HttpRequest, object_id: str) -> HttpResponse:
    instance = _instance_or_404(request, object_id)
    return HttpResponse(timeline_svg(instance), content_type="image/svg+xml")


def state_page(request: HttpRequest, object_id: str) -> HttpResponse:
    found = _instance_or_404(request, object_id)
    raw = request.GET.get("step", "")
    try:
        step = int(raw)
        if step < 0:
            raise ValueError
    except ValueError:
        messages.error(request, f"Step must be a whole number of events, 0 or more (not {raw!r}).")
        return HttpResponseRedirect(instance_url(found.id))
    state = state_at_step(found, step)
    rows = _history(found)[: state.step]
    context = {
        "title": f"State of run {found.id} at step {state.step}",
        "instance": found,
        "state": state,
        "state_items": [
            (key, json.dumps(value, indent=2, ensure_ascii=False))
            for key, value in sorted(redacted_value(state.query_state).items())
        ],
        "last_event": _event_rows(rows[-1:], int(found.created_at.timestamp() * 1000)),
        "previous_step": max(0, state.step - 1),
        "next_step": min(state.total, state.step + 1),
    }
    return _render(request, "console/state.html", context)


# --- run actions --------------------------------------------------------------------------------


def _report(request: HttpRequest, action: RunAction, outcomes: list[Any]) -> None:
    done = [o for o in outcomes if o.ok]
    if done:
        if len(done) == 1:
            text = f"Run {done[0].run_id} {done[0].message}."
        else:
            text = f"{len(done)} runs {action.done_text}."
        messages.success(request, text)
    for outcome in outcomes:
        if not outcome.ok:
            messages.error(
                request, f"{action.label} refused for {outcome.run_id}: {outcome.message}"
            )


def _confirmation(
    request: HttpRequest,
    action: RunAction,
    instances: list[WorkflowInstance],
    form: Any,
    *,
    bulk_action_name: str = "",
    truncated: int = 0,
    status: int = 200,
) -> TemplateResponse:
    return _render(
        request,
        "console/confirm_action.html",
        {
            "title": f"{action.label}: confirm",
            "action": action,
            "instances": instances,
            "form": form,
            "targets": [f"{i.id}:{i.generation}" for i in instances],
            "bulk_action_name": bulk_action_name,
            "truncated": truncated,
            "retry_plans": _retry_plans(request, action, instances),
            "cancel_url": instance_url(instances[0].id)
            if len(instances) == 1
            else changelist_url(),
        },
        status=status,
    )


def _retry_plans(
    request: HttpRequest, action: RunAction, instances: list[WorkflowInstance]
) -> list[tuple[str, str]]:
    """For a retry of one run: what each mode would do to it, for the confirmation page."""
    if action.name != "retry" or len(instances) != 1:
        return []
    plans = []
    for mode in lifecycle.RETRY_MODES:
        try:
            plan = svc.retry_plan(tenant_of(request), str(instances[0].id), mode)
        except svc.ServiceError:
            return []
        plans.append((mode, plan.effect))
    return plans


def action_page(request: HttpRequest, object_id: str, name: str) -> HttpResponse:
    """Confirm and apply one action to one run."""
    action = ACTIONS.get(name)
    if action is None:
        raise Http404(f"no action {name!r}")
    if not can_operate(request):
        raise PermissionDenied
    found = _instance_or_404(request, object_id)
    if request.method != "POST":
        return _confirmation(request, action, [found], action.form_class())
    form = action.form_class(request.POST)
    if not form.is_valid():
        messages.error(request, "Please correct the errors below.")
        return _confirmation(request, action, [found], form, status=400)
    try:
        targets = parse_targets(request.POST.getlist("runs"))
    except svc.ServiceError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(instance_url(found.id))
    if [t.run_id for t in targets] != [str(found.id)]:
        messages.error(request, "The confirmation does not match this run; start again.")
        return HttpResponseRedirect(instance_url(found.id))
    _report(
        request,
        action,
        perform(
            action,
            tenant_of(request),
            targets,
            _with_permissions(request, form),
            operator_of(request),
        ),
    )
    return HttpResponseRedirect(instance_url(found.id))


def _with_permissions(request: HttpRequest, form: Any) -> dict[str, Any]:
    """The form's data and the permissions a policy asks about (signal authorization)."""
    return {
        **form.cleaned_data,
        "may_signal": request.user.has_perm("workflows.signal_workflowinstance"),
    }


def bulk_action(
    request: HttpRequest, queryset: QuerySet[WorkflowInstance], action: RunAction, name: str
) -> HttpResponse | None:
    """The admin changelist action: a confirmation page first, then the service calls."""
    if not can_operate(request):
        raise PermissionDenied
    selected = of_tenant(queryset, tenant_of(request)).order_by("created_at")
    total = selected.count()
    instances = list(selected[:MAX_BULK])
    if not instances:
        messages.warning(request, "None of the selected runs is in this tenant.")
        return None
    if request.POST.get("confirm") != "yes":
        return _confirmation(
            request,
            action,
            instances,
            action.form_class(),
            bulk_action_name=name,
            truncated=max(0, total - MAX_BULK),
        )
    form = action.form_class(request.POST)
    if not form.is_valid():
        messages.error(request, "Please correct the errors below.")
        return _confirmation(request, action, instances, form, bulk_action_name=name, status=400)
    try:
        targets = parse_targets(request.POST.getlist("runs"))
    except svc.ServiceError as exc:
        messages.error(request, exc.message)
        return None
    allowed = {str(i.id) for i in instances}
    _report(
        request,
        action,
        perform(
            action,
            tenant_of(request),
            [t for t in targets if t.run_id in allowed],
            _with_permissions(request, form),
            operator_of(request),
        ),
    )
    return None


# --- dashboard ----------------------------------------------------------------------------------


def _schedules_url() -> str:
    try:
        return reverse("admin:schedules_schedule_changelist")
    except NoReverseMatch:
        return ""


def dashboard(request: HttpRequest) -> HttpResponse:
    tenant = tenant_of(request)
    definition = request.GET.get("definition") or None
    data = metrics.dashboard(tenant, timezone.now(), definition)
    base = changelist_url()
    status_bars = [
        charts.Bar(
            label=status.label,
            value=data.by_status.get(status.value, 0),
            colour=STATUS_COLOURS[status.value],
            href=f"{base}?status__exact={status.value}"
            + (f"&definition={definition}" if definition else ""),
        )
        for status in RunStatus
    ]
    per_minute = charts.per_minute_chart(
        "Starts and completions per minute (last hour)",
        data.minutes,
        [
            charts.Series("started", data.starts, "#2563eb"),
            charts.Series("done", data.completions, STATUS_COLOURS["done"]),
            charts.Series("failed", data.failures, STATUS_COLOURS["failed"]),
        ],
    )
    per_definition = charts.stacked_bars(
        "Runs per definition, by status",
        [
            (
                d.name,
                [
                    charts.Segment(s.label, d.by_status.get(s.value, 0), STATUS_COLOURS[s.value])
                    for s in RunStatus
                ],
                f"?definition={d.name}",
            )
            for d in data.per_definition[:30]
        ],
    )
    failure_bars = charts.bar_chart(
        "Failure rate per definition (runs ended in the last hour)",
        [
            charts.Bar(
                d.name,
                round((d.failure_rate or 0) * 100, 1),
                STATUS_COLOURS["failed"],
                text=f"{(d.failure_rate or 0) * 100:.0f}% of {d.finished_last_hour}",
            )
            for d in data.per_definition[:30]
            if d.finished_last_hour
        ],
        empty="No run ended in the last hour.",
    )
    ready_bars = charts.bar_chart(
        "Ready queue per definition (due now)",
        [
            charts.Bar(
                d.name,
                d.ready_depth,
                STATUS_COLOURS["ready"],
                text=f"{d.ready_depth}, oldest {duration_text(d.oldest_ready_s or 0)}",
            )
            for d in data.per_definition[:30]
            if d.ready_depth
        ],
        empty="Nothing is due: no run is waiting for a worker.",
    )
    context = {
        "title": "Dashboard" + (f": {definition}" if definition else ""),
        "data": data,
        "definition": definition,
        "definition_names": list(
            of_tenant(WorkflowDefinition, tenant.id)
            .values_list("name", flat=True)
            .distinct()
            .order_by("name")
        ),
        "total": sum(data.by_status.values()),
        "active": sum(data.by_status.get(s, 0) for s in ACTIVE_STATUSES),
        "dead_lettered": data.by_status.get(RunStatus.DEAD_LETTERED, 0),
        "failure_rate": None if data.failure_rate is None else f"{data.failure_rate * 100:.1f}%",
        "oldest_ready": duration_text(data.oldest_ready_s)
        if data.oldest_ready_s is not None
        else "—",
        "status_chart": mark_safe(charts.bar_chart("Runs by status", status_bars)),
        "per_minute_chart": mark_safe(per_minute),
        "per_definition_chart": mark_safe(per_definition),
        "failure_chart": mark_safe(failure_bars),
        "ready_chart": mark_safe(ready_bars),
        "schedules_url": _schedules_url(),
        "statuses": [s.label for s in RunStatus],
        "definition_rows": [
            (d, [d.by_status.get(s.value, 0) for s in RunStatus]) for d in data.per_definition
        ],
    }
    return _render(request, "console/dashboard.html", context)


# --- dead-letter queue --------------------------------------------------------------------------


def dead_letters(request: HttpRequest) -> HttpResponse:
    tenant = tenant_of(request)
    runs = of_tenant(WorkflowInstance, tenant).filter(status=RunStatus.DEAD_LETTERED)
    groups = []
    for row in (
        runs.values("definition_name", "error_code")
        .annotate(n=Count("id"), oldest=Min("completed_at"), newest=Max("completed_at"))
        .order_by("-n", "definition_name", "error_code")[:100]
    ):
        members = runs.filter(
            definition_name=row["definition_name"], error_code=row["error_code"]
        ).order_by("-completed_at")
        first = members.values_list("tenant_id", "id", "error").first()
        sample = (
            shown_column(WorkflowInstance, "error", first[0], (first[1],), first[2])
            if first
            else ""
        )
        sample = sample or ""
        ids = [str(i) for i in members.values_list("id", flat=True)[:MAX_BULK]]
        filters = f"?status__exact=dead_lettered&definition={row['definition_name']}"
        if row["error_code"]:
            filters += f"&error_code__exact={row['error_code']}"
        groups.append(
            {
                **row,
                "sample": sample,
                "ids": ids,
                "recent": list(members[:5]),
                "list_url": changelist_url() + filters,
            }
        )
    context = {
        "title": "Dead-letter queue",
        "groups": groups,
        "total": runs.count(),
        "changelist_url": changelist_url(),
        "can_operate": can_operate(request),
        "max_bulk": MAX_BULK,
        "now": timezone.now(),
    }
    return _render(request, "console/dlq.html", context)


# --- workers ------------------------------------------------------------------------------------

WORKERS_PERMISSION = "workflows.view_workerprocess"


def can_see_workers(request: HttpRequest) -> bool:
    return bool(request.user.has_perm(WORKERS_PERMISSION))


def workers_url(worker_id: str | None = None) -> str:
    base = reverse("console:workers")
    return f"{base}?{urlencode({'worker': worker_id})}" if worker_id else base


def workers(request: HttpRequest) -> HttpResponse:
    """The fleet's workers (fleet infrastructure: every tenant's console shows the same
    rows, to staff with the ``view_workerprocess`` permission) beside the console tenant's
    share of them: the runs each holds in this tenant, and this tenant's due backlog."""
    if not can_see_workers(request):
        raise PermissionDenied("viewing workers needs the view_workerprocess permission")
    tenant = tenant_of(request)
    now = fleet_now()
    wanted = request.GET.get("worker") or None
    rows = WorkerProcess.objects.all()
    if wanted:
        rows = rows.filter(worker_id=wanted)
    found = list(rows)
    runs = of_tenant(WorkflowInstance, tenant)
    ids = [w.worker_id for w in found]
    held_here = {
        row["assigned_to"]: row["n"]
        for row in runs.filter(status=RunStatus.RUNNING, assigned_to__in=ids)
        .values("assigned_to")
        .annotate(n=Count("id"))
        .order_by()
    }
    listed = []
    for worker in found:
        stale = worker.is_stale(now)
        listed.append(
            {
                "worker": worker,
                "stale": stale,
                "age": duration_text(worker.heartbeat_age_s(now)),
                "uptime": age_text(worker.started_at, now),
                "queues": ", ".join(worker.task_queues or []),
                "held_here": held_here.get(worker.worker_id, 0),
                "held_url": changelist_url()
                + "?"
                + urlencode({"status__exact": RunStatus.RUNNING, "assigned_to": worker.worker_id}),
            }
        )
    live = [w for w in listed if not w["stale"]]
    queued = [
        {"item": item, "oldest": duration_text(item.oldest_age_s(now))}
        for item in backlog(runs, now)
    ]
    context = {
        "title": "Workers",
        "now": now,
        "wanted": wanted,
        "workers": listed,
        "live_count": len(live),
        "stale_count": len(listed) - len(live),
        "steps_per_s": sum(w["worker"].steps_per_s for w in live),
        "runs_held": sum(w["worker"].runs_held for w in live),
        "backlog": queued,
        "backlog_depth": sum(q["item"].depth for q in queued),
        "stale_after_beats": STALE_AFTER_BEATS,
    }
    return _render(request, "console/workers.html", context)


# --- tenant switcher ----------------------------------------------------------------------------


def switch_tenant(request: HttpRequest) -> HttpResponse:
    """The header's tenant switcher: a POST (with the CSRF token the admin requires) only,
    so that no link can move a superuser's console into another tenant."""
    if not request.user.is_superuser:
        raise PermissionDenied("only superusers may switch tenant")
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    target = request.POST.get("tenant", "")
    following = request.POST.get("next") or reverse("admin:index")
    if not url_has_allowed_host_and_scheme(following, {request.get_host()}):
        following = reverse("admin:index")
    # A detail page of the old tenant's run means nothing in the new one.
    if "/workflowinstance/" in following and not following.rstrip("/").endswith("workflowinstance"):
        following = changelist_url()
    try:
        tenant = Tenant.objects.filter(id=UUID(target), is_active=True).first()
    except ValueError:
        tenant = None
    if tenant is None:
        messages.error(request, f"No active tenant {target!r}.")
        return redirect(following)
    request.session[SESSION_KEY] = str(tenant.id)
    messages.info(request, f"Now working in tenant {tenant.name}.")
    return redirect(following)


# --- definitions --------------------------------------------------------------------------------


def definition_url(definition: WorkflowDefinition) -> str:
    return reverse("admin:workflows_workflowdefinition_change", args=[definition.pk])


def deploy_page(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("workflows.add_workflowdefinition"):
        raise PermissionDenied
    tenant = tenant_of(request)
    form = DeployForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            deployed = defs.deploy_definition(
                tenant,
                data["name"],
                data["wasm_bytes"],
                version=data.get("version"),
                min_version=data.get("min_version") or 0,
                retry_max_attempts=data.get("retry_max_attempts"),
                child_binding=data.get("child_binding") or "",
                child_versions=defs.parse_child_versions(data.get("child_versions") or ""),
                plugin_dependencies=data.get("plugin_dependencies") or {},
                allowed_signal_callers=[
                    c.strip()
                    for c in (data.get("allowed_signal_callers") or "").split(",")
                    if c.strip()
                ],
            )
        except svc.ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Deployed {deployed.name} version {deployed.version}.")
            return HttpResponseRedirect(definition_url(deployed))
    return _render(
        request,
        "console/definition_upload.html",
        {
            "title": "Deploy a workflow module",
            "form": form,
            "opts": WorkflowDefinition._meta,
        },
        status=400 if form.errors else 200,
    )


def definition_page(request: HttpRequest, object_id: str) -> HttpResponse:
    tenant = tenant_of(request)
    try:
        pk = int(object_id)
    except ValueError:
        pk = -1
    definition = of_tenant(WorkflowDefinition, tenant).filter(pk=pk).defer("wasm").first()
    if definition is None:
        raise Http404(f"No definition {object_id!r} in this tenant.")
    here = definition_url(definition)
    can_change = request.user.has_perm("workflows.change_workflowdefinition")
    if request.method == "POST" and request.POST.get("op") == "start":
        if not can_operate(request):
            raise PermissionDenied
        return _start_run(request, tenant, definition, here)
    if request.method == "POST":
        if not can_change:
            raise PermissionDenied
        _definition_change(request, tenant, definition)
        return HttpResponseRedirect(here)
    versions = list(
        of_tenant(WorkflowDefinition, tenant.id)
        .filter(name=definition.name)
        .defer("wasm")
        .annotate(runs=Count("workflowinstance"))
        .order_by("-version")
    )
    active = dict(
        of_tenant(WorkflowInstance, tenant.id)
        .filter(definition_name=definition.name, status__in=ACTIVE_STATUSES)
        .values_list("definition_version")
        .annotate(n=Count("id"))
        .order_by()
    )
    tags = list(of_tenant(VersionTag, tenant.id).filter(name=definition.name).order_by("tag"))
    rules = {
        r.version: r.weight for r in defs.list_routing_rules(tenant, definition.name)
    }  # the service reads in this tenant's context
    routable = [v for v in versions if not v.deprecated]
    context = {
        "title": f"{definition.name} version {definition.version}",
        "definition": definition,
        "versions": [
            {
                "row": v,
                "active": active.get(v.version, 0),
                "tags": [t.tag for t in tags if t.version == v.version],
                "weight": rules.get(v.version),
                "url": definition_url(v),
            }
            for v in versions
        ],
        "tags": tags,
        "tag_form": TagForm(
            versions=[v.version for v in versions], initial={"version": definition.version}
        ),
        "routing_form": RoutingForm(versions=[v.version for v in routable], weights=rules),
        "can_change": can_change,
        "can_operate": can_operate(request),
        "start_form": StartRunForm(),
        "runs_url": f"{changelist_url()}?definition={definition.name}",
        "opts": WorkflowDefinition._meta,
    }
    return _render(request, "console/definition.html", context)


class StartRunForm(forms.Form):
    input = JSONTextField(required=False, initial="{}", help_text="The run's input, as JSON.")


def _start_run(
    request: HttpRequest, tenant: Tenant, definition: WorkflowDefinition, here: str
) -> HttpResponse:
    """ "Start a run" on a version's page: a run of exactly this version, through the same
    service as the API's start; a worker beside the admin picks it up."""
    form = StartRunForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Run not started: {_form_errors(form)}")
        return HttpResponseRedirect(here)
    try:
        instance, _ = svc.start_workflow(
            tenant, definition.name, form.cleaned_data["input"], version=definition.version
        )
    except svc.ServiceError as exc:
        messages.error(request, f"Run not started: {exc.message}")
        return HttpResponseRedirect(here)
    messages.success(
        request,
        f"Started run {instance.id} of {definition.name} v{definition.version}: a worker "
        "(manage.py runworker) picks it up.",
    )
    return HttpResponseRedirect(instance_url(instance.id))


def _definition_change(
    request: HttpRequest, tenant: Tenant, definition: WorkflowDefinition
) -> None:
    op = request.POST.get("op", "")
    operator = operator_of(request)
    name = definition.name
    try:
        if op == "deprecate":
            defs.deprecate_definition(
                tenant, name, definition.version, operator, request.POST.get("reason", "")
            )
            messages.success(request, f"{name} v{definition.version} is deprecated.")
        elif op == "restore":
            defs.restore_definition(
                tenant, name, definition.version, operator, request.POST.get("reason", "")
            )
            messages.success(request, f"{name} v{definition.version} is restored.")
        elif op == "set_tag":
            versions = list(
                of_tenant(WorkflowDefinition, tenant.id)
                .filter(name=name)
                .values_list("version", flat=True)
            )
            form = TagForm(request.POST, versions=versions)
            if not form.is_valid():
                messages.error(request, f"Tag not set: {_form_errors(form)}")
                return
            defs.set_tag(
                tenant, name, form.cleaned_data["tag"], form.cleaned_data["version"], operator
            )
            messages.success(
                request,
                f"Tag {form.cleaned_data['tag']} now points at v{form.cleaned_data['version']}.",
            )
        elif op == "remove_tag":
            tag = request.POST.get("tag", "")
            defs.remove_tag(tenant, name, tag, operator)
            messages.success(request, f"Tag {tag} removed.")
        elif op == "set_routing":
            versions = list(
                of_tenant(WorkflowDefinition, tenant.id)
                .filter(name=name, deprecated=False)
                .values_list("version", flat=True)
            )
            form = RoutingForm(request.POST, versions=versions)
            if not form.is_valid():
                messages.error(request, f"Routing not changed: {_form_errors(form)}")
                return
            defs.set_routing_rules(tenant, name, form.rules(), operator)
            messages.success(request, "Routing weights saved.")
        else:
            messages.error(request, f"Unknown operation {op!r}.")
    except svc.ServiceError as exc:
        messages.error(request, exc.message)


def _form_errors(form: Any) -> str:
    return "; ".join(
        f"{field}: {' '.join(errors)}" if field != "__all__" else " ".join(errors)
        for field, errors in form.errors.items()
    )
