"""Schedules in the operator console. Forms validate through ``schedules.services`` and
every change goes through it too (create, update, delete, enable, disable, trigger,
backfill); nothing here writes a row itself. Pages render in the session tenant's context
(``workflows.middleware``) and show only its schedules (``TenantScopedAdmin``: MariaDB and
SQLite have no row-level security; another tenant's schedule is a 404)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone as dj_timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from schedules import services
from schedules.cron import CronError, load_zone
from schedules.models import OverlapPolicy, Schedule
from schedules.scheduler import Delivery
from workflows.console.scoping import TenantScopedAdmin
from workflows.models import Tenant, WorkflowInstance
from workflows.redaction import REDACTED, redacted_text
from workflows.services import ServiceError
from workflows.tenancy import current_tenant, of_tenant

PREVIEW_COUNT = 5


def _tenant() -> Tenant:
    return Tenant.objects.get(id=current_tenant())


def _operator(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return f"admin:{user.get_username()}" if user is not None else "admin"


class ScheduleForm(forms.ModelForm):
    """Field checks name the field (``cron``: ``minute field '61': 61 is outside 0-59``);
    the cross-field ones (definition, entry point, unique name) come from the service's
    validation, attached to the field it names."""

    class Meta:
        model = Schedule
        fields = services.EDITABLE_FIELDS
        widgets = {
            "input": forms.Textarea(attrs={"rows": 3, "cols": 60}),
            "notes": forms.Textarea(attrs={"rows": 4, "cols": 60}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The input is shown redacted, as the API shows it. Sent back unchanged it keeps the
        # stored values; a placeholder typed into a changed input would replace a secret.
        self.stored_input: str | None = None if self.instance._state.adding else self.instance.input
        self.shown_input = redacted_text(self.stored_input) if self.stored_input else None
        if self.stored_input is not None and "input" in self.fields:
            self.initial["input"] = self.shown_input
            if self.shown_input != self.stored_input:
                self.fields["input"].help_text = (
                    f"JSON passed to every run. Sensitive values are shown as {REDACTED}: "
                    "leave the input as shown to keep them, or type the whole input anew."
                )

    def clean_input(self) -> str:
        value = str(self.cleaned_data.get("input") or "")
        if self.stored_input is not None and value == self.shown_input:
            return self.stored_input
        if REDACTED in value:
            raise forms.ValidationError(
                f"input contains {REDACTED}, the placeholder of a redacted value: type the "
                "real values (or leave the input as shown to keep the stored ones)"
            )
        return value

    def clean_cron(self) -> str:
        cron = str(self.cleaned_data.get("cron") or "")
        try:
            services.timing_for(cron, "UTC")
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from None
        return cron

    def clean_timezone(self) -> str:
        name = str(self.cleaned_data.get("timezone") or "UTC")
        try:
            load_zone(name)
        except CronError as exc:
            raise forms.ValidationError(exc.message) from None
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        values = {name: data.get(name) for name in services.EDITABLE_FIELDS if name in data}
        adding = self.instance._state.adding
        try:
            services.validate_schedule(
                _tenant(), values, schedule_id=None if adding else self.instance.pk
            )
        except ServiceError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return data


class BackfillForm(forms.Form):
    start = forms.DateTimeField(help_text="UTC, e.g. 2026-03-08 00:00")
    end = forms.DateTimeField(help_text="UTC, inclusive; not in the future")
    overlap_policy = forms.ChoiceField(
        choices=[("", "the schedule's own"), *OverlapPolicy.choices],
        required=False,
        help_text="Each instant is delivered under this policy.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("start"), data.get("end")
        if isinstance(start, datetime) and isinstance(end, datetime) and end < start:
            self.add_error("end", "end is before start")
        return data


def _describe(made: list[Delivery]) -> str:
    counts: dict[str, int] = {}
    for delivery in made:
        counts[delivery.outcome] = counts.get(delivery.outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "nothing due"


@admin.register(Schedule)
class ScheduleAdmin(TenantScopedAdmin):
    form = ScheduleForm
    # The change page adds "Trigger now" and "Pause" / "Resume" buttons to its tools.
    change_form_template = "schedules/change_form.html"
    # Short columns, so the list fits a 1280 px window: the next instant (the next five on
    # the schedule's page; "disabled" for a paused schedule), the last run and the two
    # policies by their codes.
    list_display = (
        "name",
        "workflow_name",
        "cron_column",
        "timezone",
        "next_fire",
        "last_run_column",
        "policies",
    )
    list_filter = ("enabled", "timezone", "misfire_policy", "overlap_policy")
    search_fields = ("name", "workflow_name", "cron", "notes")
    readonly_fields = (
        "next_fire_times",
        "next_run_at",
        "last_run",
        "buffered_instants",
        "created_by_run",
        "created_at",
    )
    actions = ("enable_schedules", "disable_schedules", "trigger_now", "backfill")

    # --- columns ---

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if obj is not None and not self.has_change_permission(request, obj):
            # View only: the page shows each field's stored value; the input, redacted.
            fields = ["input_shown" if name == "input" else name for name in fields]
        return fields

    @admin.display(description="input")
    def input_shown(self, obj: Schedule) -> str:
        return redacted_text(obj.input)

    @admin.display(description=f"next {PREVIEW_COUNT} fire times")
    def next_fire_times(self, obj: Schedule) -> str:
        if obj.pk and not obj._state.adding:
            # A form sent back with errors carries the rejected values: preview the
            # schedule as saved, not an expression that did not validate.
            obj = of_tenant(Schedule, obj.tenant_id).filter(pk=obj.pk).first() or obj
        if not obj.cron:
            return "shown once the schedule is saved with a valid cron expression"
        if not obj.enabled:
            return "disabled"
        try:
            timing = obj.timing
        except CronError as exc:
            return f"cannot evaluate: {exc.message}"
        start = obj.next_run_at or dj_timezone.now()
        first = [start] if obj.next_run_at else []
        instants = first + timing.preview(start, PREVIEW_COUNT - len(first))
        return format_html_join(
            mark_safe("<br>"),  # a constant
            "{}",
            ((timing.local(t).strftime("%Y-%m-%d %H:%M %Z"),) for t in instants),
        )

    @admin.display(description="cron", ordering="cron")
    def cron_column(self, obj: Schedule) -> str:
        return format_html("<code>{}</code>", obj.cron)

    @admin.display(description="next fire", ordering="next_run_at")
    def next_fire(self, obj: Schedule) -> str:
        if not obj.enabled:
            return "disabled"
        if obj.next_run_at is None:
            return "-"
        try:
            timing = obj.timing
        except CronError as exc:
            return f"cannot evaluate: {exc.message}"
        instants = [obj.next_run_at, *timing.preview(obj.next_run_at, PREVIEW_COUNT - 1)]
        shown = [timing.local(t).strftime("%Y-%m-%d %H:%M %Z") for t in instants]
        # The next instant on the schedule's wall clock; the next five as its tooltip.
        return format_html(
            '<time datetime="{}" title="next {}: {}">{}</time>',
            obj.next_run_at.isoformat(),
            PREVIEW_COUNT,
            ", ".join(shown),
            timing.local(obj.next_run_at).strftime("%m-%d %H:%M %Z"),
        )

    @admin.display(description="policies (misfire / overlap)")
    def policies(self, obj: Schedule) -> str:
        return format_html(
            '<span title="{} / {}">{} /<wbr> {}</span>',
            obj.get_misfire_policy_display(),
            obj.get_overlap_policy_display(),
            obj.misfire_policy,
            obj.overlap_policy,
        )

    @admin.display(description="last run", ordering="last_run_at")
    def last_run_column(self, obj: Schedule) -> str:
        if obj.last_run_id is None:
            return "-"
        url = reverse("admin:workflows_workflowinstance_change", args=[obj.last_run_id])
        status = (
            of_tenant(WorkflowInstance, obj.tenant_id)
            .filter(id=obj.last_run_id)
            .values_list("status", flat=True)
            .first()
        )
        when = (
            dj_timezone.localtime(obj.last_run_at).strftime("%m-%d %H:%M")
            if obj.last_run_at
            else ""
        )
        return format_html(
            '<a href="{}"><code>{}…</code></a> <span class="nowrap">{}</span> ({})',
            url,
            str(obj.last_run_id)[:8],
            when,
            str(status).replace("_", "-") if status else "gone",
        )

    @admin.display(description="last run")
    def last_run(self, obj: Schedule) -> str:
        if obj.last_run_id is None:
            return "-"
        url = reverse("admin:workflows_workflowinstance_change", args=[obj.last_run_id])
        status = (
            of_tenant(WorkflowInstance, obj.tenant_id)
            .filter(id=obj.last_run_id)
            .values_list("status", flat=True)
            .first()
        )
        when = obj.last_run_at.strftime("%Y-%m-%d %H:%M:%S UTC") if obj.last_run_at else ""
        return format_html(
            '<a href="{}">{}</a> {} ({})',
            url,
            str(obj.last_run_id)[:8],
            when,
            str(status).replace("_", "-") if status else "gone",
        )

    # --- saving through the services ---

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        values = {
            name: form.cleaned_data[name]
            for name in services.EDITABLE_FIELDS
            if name in form.cleaned_data
        }
        if change:
            saved = services.update_schedule(
                _tenant(), obj.pk, operator=_operator(request), **values
            )
        else:
            saved = services.create_schedule(_tenant(), operator=_operator(request), **values)
        for model_field in Schedule._meta.concrete_fields:
            setattr(obj, model_field.attname, getattr(saved, model_field.attname))
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        services.delete_schedule(_tenant(), obj.pk, operator=_operator(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            services.delete_schedule(_tenant(), schedule.pk, operator=_operator(request))

    # --- the change page's buttons ---

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/do/<str:verb>/",
                wrap(self.button_view),
                name="schedules_schedule_button",
            ),
            *super().get_urls(),
        ]

    def button_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """``Trigger now``, ``Pause`` and ``Resume`` on a schedule's page (POST only)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        schedule = self.get_object(request, object_id)
        if schedule is None or verb not in ("trigger", "pause", "resume"):
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_change_permission(request, schedule):
            raise PermissionDenied
        try:
            if verb == "trigger":
                made = services.trigger_schedule(
                    _tenant(), schedule.pk, operator=_operator(request)
                )
                self.message_user(request, f"{schedule.name}: triggered, {_describe(made)}.")
            elif verb == "pause":
                services.pause_schedule(_tenant(), schedule.pk, operator=_operator(request))
                self.message_user(request, f"{schedule.name}: paused.")
            else:
                services.resume_schedule(_tenant(), schedule.pk, operator=_operator(request))
                self.message_user(request, f"{schedule.name}: resumed.")
        except ServiceError as exc:
            self.message_user(request, f"{schedule.name}: {exc.message}", messages.ERROR)
        return HttpResponseRedirect(reverse("admin:schedules_schedule_change", args=[schedule.pk]))

    # --- actions ---

    @admin.action(description="Enable (resume at the next future instant)")
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            services.resume_schedule(_tenant(), schedule.pk, operator=_operator(request))
        self.message_user(request, f"Enabled {queryset.count()} schedule(s).")

    @admin.action(description="Disable")
    def disable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            services.pause_schedule(_tenant(), schedule.pk, operator=_operator(request))
        self.message_user(request, f"Disabled {queryset.count()} schedule(s).")

    @admin.action(description="Trigger now (honours the overlap policy)")
    def trigger_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            try:
                made = services.trigger_schedule(
                    _tenant(), schedule.pk, operator=_operator(request)
                )
            except ServiceError as exc:
                self.message_user(request, f"{schedule.name}: {exc.message}", messages.ERROR)
                continue
            self.message_user(request, f"{schedule.name}: {_describe(made)}")

    @admin.action(description="Backfill a time range…")
    def backfill(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> HttpResponse | None:
        if "apply" in request.POST:
            form = BackfillForm(request.POST)
            if form.is_valid():
                results: list[str] = []
                current = None
                try:
                    with transaction.atomic():  # all schedules or none
                        for current in queryset:
                            made = services.backfill_schedule(
                                _tenant(),
                                current.pk,
                                form.cleaned_data["start"],
                                form.cleaned_data["end"],
                                overlap_policy=form.cleaned_data["overlap_policy"] or None,
                                operator=_operator(request),
                            )
                            results.append(f"{current.name}: {_describe(made)}")
                except ServiceError as exc:
                    field = exc.field if exc.field in form.fields else None
                    name = current.name if current is not None else ""
                    form.add_error(field, f"{name}: {exc.message}")
                else:
                    self.message_user(request, "Backfilled " + "; ".join(results) + ".")
                    return None
        else:
            form = BackfillForm()
        context = {
            **self.admin_site.each_context(request),
            "title": "Backfill schedules",
            "opts": self.model._meta,
            "form": form,
            "queryset": queryset,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "schedules/backfill.html", context)
