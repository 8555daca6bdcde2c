"""Cron schedules that start workflows, evaluated on a wall clock in an IANA time zone.

The policy columns carry CHECK constraints: the scheduler reads them in a background loop
that has nobody to report a bad value to, so a value it cannot interpret must be impossible
to store rather than handled at 03:00.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone as dj_timezone

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


class Schedule(TenantScoped):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=128, validators=[name_validator])
    workflow_name = models.CharField(max_length=128)
    workflow_version = models.PositiveIntegerField(null=True, blank=True)
    workflow_tag = models.CharField(max_length=64, blank=True, default="")
    entry_point = models.CharField(max_length=128, default="run")
    cron = models.CharField(max_length=128)
    input = models.TextField(default="null")
    enabled = models.BooleanField(default=True)
    timezone = models.CharField(max_length=64, default="UTC")
    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.CATCH_UP
    )
    catch_up_limit = models.PositiveIntegerField(default=60)
    overlap_policy = models.CharField(
        max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW
    )
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.UUIDField(null=True, blank=True)
    pause_on_failure = models.BooleanField(default=False)
    notes = models.TextField(blank=True, default="")
    created_by_run = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(default=dj_timezone.now)

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
