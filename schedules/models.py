"""Cron schedules that start workflows, evaluated on a wall clock in an IANA time zone.

The policy columns carry CHECK constraints: the scheduler reads them in a background loop
that has nobody to report a bad value to, so a value it cannot interpret must be impossible
to store rather than handled at 03:00.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone as dj_timezone

from schedules.cron import CronSchedule, compile_cron
from workflows.crypto import SealedModel, SealedTextField
from workflows.models import TenantScoped, name_validator


class MisfirePolicy(models.TextChoices):
    CATCH_UP = "catch_up", "catch up (deliver missed instants, up to the limit)"
    SKIP = "skip", "skip (resume at the next future instant)"


class OverlapPolicy(models.TextChoices):
    ALLOW = "allow", "allow"
    SKIP = "skip", "skip"
    BUFFER_ONE = "buffer_one", "buffer one"
    BUFFER_ALL = "buffer_all", "buffer all"
    CANCEL_OTHER = "cancel_other", "cancel the previous run"
    TERMINATE_OTHER = "terminate_other", "terminate the previous run"


class Schedule(SealedModel, TenantScoped):
    """A cron schedule that starts ``workflow_name`` at each instant it names on the wall
    clock of ``timezone``. The scheduler (``schedules.scheduler``) owns ``next_run_at``,
    ``last_run_*`` and the buffer; operators change the rest through
    ``schedules.services``."""

    SEAL_OWNER = ("id",)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(
        max_length=128, validators=[name_validator], help_text="Unique within the tenant."
    )
    workflow_name = models.CharField(max_length=128, help_text="The definition each run starts.")
    workflow_version = models.PositiveIntegerField(
        null=True, blank=True, help_text="Pin a version; empty: the tag, else routing/latest."
    )
    workflow_tag = models.CharField(
        max_length=64, blank=True, default="", help_text="A version tag such as 'stable'."
    )
    entry_point = models.CharField(max_length=128, default="run")
    cron = models.CharField(
        max_length=128,
        help_text="Five fields (minute hour day-of-month month day-of-week) or @hourly, "
        "@daily, @weekly, @monthly, @yearly; evaluated on the wall clock of the time zone.",
    )
    input = SealedTextField(default="null", help_text="JSON passed to every run.")
    enabled = models.BooleanField(default=True)
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="IANA zone name, e.g. Europe/London."
    )
    misfire_policy = models.CharField(
        max_length=16,
        choices=MisfirePolicy.choices,
        default=MisfirePolicy.CATCH_UP,
        help_text="What instants missed while no scheduler ran (an outage) mean.",
    )
    catch_up_limit = models.PositiveIntegerField(
        default=60, help_text="catch_up delivers at most this many missed instants."
    )
    overlap_policy = models.CharField(
        max_length=16,
        choices=OverlapPolicy.choices,
        default=OverlapPolicy.ALLOW,
        help_text="What an instant does while the previous run of this schedule is going.",
    )
    next_run_at = models.DateTimeField(
        null=True, blank=True, help_text="The next instant (UTC); empty until initialised."
    )
    last_run_at = models.DateTimeField(
        null=True, blank=True, help_text="The intended instant of the last run started."
    )
    last_run_id = models.UUIDField(null=True, blank=True)
    pause_on_failure = models.BooleanField(
        default=False, help_text="Disable the schedule when its last run failed."
    )
    notes = models.TextField(blank=True, default="")
    created_by_run = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(default=dj_timezone.now)
    # buffer_one / buffer_all: instants waiting for the previous run to finish, oldest first
    # (ISO 8601, UTC). The count is kept beside the list so the due query needs no JSON
    # functions (they differ on every database).
    buffered_instants = models.JSONField(default=list, blank=True)
    buffered_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="schedule_unique_name"),
            models.CheckConstraint(
                condition=models.Q(misfire_policy__in=MisfirePolicy.values),
                name="schedule_misfire_policy_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(overlap_policy__in=OverlapPolicy.values),
                name="schedule_overlap_policy_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(catch_up_limit__gte=1), name="schedule_catch_up_limit_positive"
            ),
        ]
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="schedule_due")]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def timing(self) -> CronSchedule:
        """The runtime cron object; raises :class:`schedules.cron.CronError` for a stored
        expression or zone this process cannot evaluate."""
        return compile_cron(self.cron, self.timezone)
