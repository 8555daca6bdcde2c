"""Tenants, API keys, workflow definitions, instances, their event history and everything a
running instance owns (signals, promises, updates, locks, scoped state, invocations), and
the audit log of operators' actions.

Every tenant-scoped table has ``tenant_id``; on PostgreSQL the migrations enable and force
row-level security on each (``workflows/rls.py``). Status values, event types and error codes
are each defined once, in ``engine``; the run statuses' choices here are built from
``engine.status.RunStatus``.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from engine import compaction
from engine.errors import ErrorCode
from engine.events import EncodedEvent, EventType
from engine.lifecycle import RetryPolicy
from engine.status import TERMINAL_STATUSES as ENGINE_TERMINAL_STATUSES
from engine.status import RunStatus as EngineRunStatus
from engine.versions import ChildBinding as EngineChildBinding
from engine.versions import DeployedVersion
from workflows.crypto import (
    SealedJSONField,
    SealedModel,
    SealedTextField,
    Unopened,
    open_column,
)
from workflows.tenancy import of_tenant

DEFAULT_TENANT_ID = uuid.UUID("00000000-0000-0000-0000-000000000000")

# The rule for workflow, schedule and tag names; the API's serializers match the same pattern.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
name_validator = RegexValidator(
    NAME_PATTERN,
    "Use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit.",
)


# The engine defines the run statuses; this is their Django face (``.choices``, ``.label``)
# with the same names, values and labels, so the model field's choices do not move.
RunStatus = models.TextChoices(
    "RunStatus",
    [(s.name, (s.value, s.label)) for s in EngineRunStatus],
    module=__name__,
)

TERMINAL_STATUSES = frozenset(RunStatus(s.value) for s in ENGINE_TERMINAL_STATUSES)
ACTIVE_STATUSES = frozenset({RunStatus.READY, RunStatus.RUNNING, RunStatus.PAUSED})

ERROR_CODE_CHOICES = [(c.value, c.value) for c in ErrorCode]
EVENT_TYPE_CHOICES = [(t.code, t.value) for t in EventType]


class Kind(models.TextChoices):
    CORE = "core", "core module"
    COMPONENT = "component", "component"


class Role(models.TextChoices):
    READ_ONLY = "read_only", "read-only"
    OPERATOR = "operator", "operator"
    ADMIN = "admin", "admin"


class ParentClosePolicy(models.TextChoices):
    TERMINATE = "terminate", "terminate"
    ABANDON = "abandon", "abandon"
    REQUEST_CANCEL = "request_cancel", "request cancel"


# How a definition's children get their versions: the engine's values (the resolution rule,
# engine/versions.py, reads them), with labels for the admin.
_CHILD_BINDING_LABELS = {
    EngineChildBinding.DEFAULT: "default (parent's version, else latest compatible)",
    EngineChildBinding.FROZEN: "frozen (versions pinned at deploy)",
    EngineChildBinding.STABLE: "stable (the version tagged stable)",
    EngineChildBinding.LATEST: "latest (the newest non-deprecated version)",
}
ChildBinding = models.TextChoices(
    "ChildBinding",
    [(b.name, (b.value, _CHILD_BINDING_LABELS[b])) for b in EngineChildBinding],
    module=__name__,
)


class Tenant(models.Model):
    """A tenant: everything else belongs to exactly one. Not itself RLS-scoped (it is the
    registry the scoping refers to); the application role may only read it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=128, unique=True, validators=[name_validator])
    # Quota overrides (engine/policies.py): empty takes the CLEAT_MAX_* setting; 0 is
    # unlimited.
    schedule_quota = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="schedules quota",
        help_text="Most schedules this tenant may hold, workflows and API alike "
        "(empty: CLEAT_MAX_SCHEDULES_PER_TENANT; 0: unlimited).",
    )
    max_children_per_run = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="children quota",
        help_text="Most child runs one run may start (empty: CLEAT_MAX_CHILDREN_PER_RUN; "
        "0: unlimited).",
    )
    max_locks_per_run = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="locks quota",
        help_text="Most locks and concurrency keys one run may hold at once (empty: "
        "CLEAT_MAX_LOCKS_PER_RUN; 0: unlimited).",
    )
    is_active = models.BooleanField(
        default=True,
        help_text="Deactivate (the tenant admin's action) to pause every run and schedule.",
    )
    max_running = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        verbose_name="most running runs",
        help_text="Most runs of this tenant running at once (empty: CLEAT_TENANT_MAX_RUNNING).",
    )
    # When a claim last handed out one of its runs: claims serve the tenant waiting longest
    # first, so no tenant's backlog starves another (see store/lifecycle.py).
    last_claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


# A run's priority orders the runs of its own tenant (claims take turns between tenants).
# Bounded, so a start cannot claim an urgency no other run can match; API keys are held to
# their role's share of it (CLEAT_PRIORITY_MAX_BY_ROLE).
PRIORITY_MIN = -100
PRIORITY_MAX = 100


class TenantScoped(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=True)

    class Meta:
        abstract = True


def hash_api_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


class ApiKey(TenantScoped):
    """A client credential. Only the SHA-256 of the key is stored; the key is shown once."""

    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a key.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.OPERATOR)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    may_signal = models.BooleanField(
        default=False,
        help_text="May signal runs while signal authorization (CLEAT_REQUIRE_SIGNAL_AUTH) is on.",
    )

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, tenant: Tenant, name: str, role: str = Role.OPERATOR) -> tuple[ApiKey, str]:
        """Create a key and return it with its plaintext (the only time it is available)."""
        plaintext = "clt_" + secrets.token_urlsafe(32)
        key = cls.objects.create(
            tenant=tenant,
            name=name,
            prefix=plaintext[:12],
            key_hash=hash_api_key(plaintext),
            role=role,
        )
        return key, plaintext

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class WorkflowDefinition(TenantScoped):
    """One deployed version of a workflow: the WebAssembly bytes and what deploy learned."""

    name = models.CharField(max_length=128, validators=[name_validator])
    version = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    wasm = models.BinaryField()
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CORE)
    abi_version = models.PositiveSmallIntegerField(default=1)
    min_version = models.PositiveIntegerField(
        default=0, help_text="Oldest version whose histories this code can still replay."
    )
    entry_points = models.JSONField(default=list)
    plugin_dependencies = models.JSONField(
        default=dict, blank=True, help_text='Semver constraints: {"llm": ">=1.2.0"}.'
    )
    plugin_versions = models.JSONField(
        default=dict,
        blank=True,
        help_text="The plugin versions the dependencies resolved to at deploy (newest fitting).",
    )
    max_history_length = models.PositiveIntegerField(
        default=0, help_text="Events before a run continues as new (0: the engine default)."
    )
    retry_max_attempts = models.PositiveIntegerField(
        default=3, help_text="Segments attempted for a retryable failure before dead-lettering."
    )
    retry_initial_interval_s = models.FloatField(default=1.0)
    retry_backoff_coefficient = models.FloatField(default=2.0)
    retry_max_interval_s = models.FloatField(default=300.0)
    deprecated = models.BooleanField(default=False)
    child_binding = models.CharField(
        max_length=8,
        choices=ChildBinding.choices,
        default=ChildBinding.DEFAULT,
        blank=True,
        help_text="How this version's children get their versions (engine/versions.py).",
    )
    child_versions = models.JSONField(
        default=dict,
        blank=True,
        help_text='With child_binding frozen: {"child name": version} pinned at deploy.',
    )
    allowed_signal_callers = models.JSONField(
        default=list,
        blank=True,
        help_text="With CLEAT_REQUIRE_SIGNAL_AUTH on: the workflows whose runs may signal "
        "this version's runs (empty: none may).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name", "version"], name="definition_unique_version"
            )
        ]
        indexes = [models.Index(fields=["tenant", "name", "-version"])]
        ordering = ["name", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def deployed_version(self) -> DeployedVersion:
        """What :mod:`engine.versions`' rules need to know about this version."""
        return DeployedVersion(
            version=self.version,
            deprecated=self.deprecated,
            min_version=self.min_version,
            entry_points=tuple(self.entry_points or ()),
            child_binding=self.child_binding,
            child_versions=dict(self.child_versions or {}),
            allowed_signal_callers=tuple(self.allowed_signal_callers or ()),
        )

    @property
    def retry_policy(self) -> RetryPolicy:
        """The policy :mod:`engine.lifecycle` retries a retryable failure of a run with."""
        return RetryPolicy(
            max_attempts=self.retry_max_attempts,
            initial_interval_s=self.retry_initial_interval_s,
            backoff_coefficient=self.retry_backoff_coefficient,
            max_interval_s=self.retry_max_interval_s,
        )


class VersionTag(TenantScoped):
    """A named pointer to a version ("stable", "canary")."""

    name = models.CharField(max_length=128)
    tag = models.CharField(max_length=64, validators=[name_validator])
    version = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name", "tag"], name="version_tag_unique")
        ]


class RoutingRule(TenantScoped):
    """Weighted routing of new starts across versions (A/B, canaries)."""

    name = models.CharField(max_length=128)
    version = models.PositiveIntegerField()
    weight = models.FloatField(validators=[MinValueValidator(0.0)])

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name", "version"], name="routing_rule_unique"
            )
        ]


class WorkflowInstance(SealedModel, TenantScoped):
    """One run of a workflow. ``id`` is the run id; ``workflow_id`` stays the same across
    continue-as-new, so the chain of runs shares it."""

    SEAL_OWNER = ("id",)

    # No index of its own: the indexes below lead with the tenant (one fewer to write at
    # every start, claim and finalize).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False)
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by instance_workflow_id (Meta.indexes): db_index would add a second index on
    # PostgreSQL, for LIKE patterns, that no query uses and every transition writes.
    workflow_id = models.CharField(max_length=128)
    definition = models.ForeignKey(WorkflowDefinition, on_delete=models.PROTECT)
    definition_name = models.CharField(max_length=128)
    definition_version = models.PositiveIntegerField()
    entry_point = models.CharField(max_length=128, default="run")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.READY)
    # Payloads: sealed at rest when encryption is on (workflows/crypto.py).
    input = SealedTextField(default="null")
    result = SealedTextField(null=True, blank=True)
    error = SealedTextField(null=True, blank=True)
    error_code = models.CharField(max_length=32, null=True, blank=True, choices=ERROR_CODE_CHOICES)
    # Claim and fencing: a claim sets running + assigned_to and bumps generation; every
    # write of the segment names (assigned_to, generation) and touches nothing otherwise.
    generation = models.BigIntegerField(default=0)
    assigned_to = models.CharField(max_length=128, null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Due when next_wake_at <= now; NULL while waiting for something to wake it.
    next_wake_at = models.DateTimeField(null=True, blank=True, default=timezone.now)
    # Dispatch on the broker (CLEAT_DISPATCH=celery): when "run X is ready" was last
    # published. The sweep publishes a due run whose message is older than its due time (a
    # timer, a retry, a reaped lease) or older than the redelivery delay (a lost message).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    priority = models.IntegerField(
        default=0, validators=[MinValueValidator(PRIORITY_MIN), MaxValueValidator(PRIORITY_MAX)]
    )
    task_queue = models.CharField(max_length=64, default="default")
    sticky_worker = models.CharField(max_length=128, null=True, blank=True)
    # Indexed by instance_parent (Meta.indexes), only where there is a parent.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        db_index=False,
    )
    parent_close_policy = models.CharField(
        max_length=16, choices=ParentClosePolicy.choices, default=ParentClosePolicy.TERMINATE
    )
    # A run started by run_detached: the run that started it, which its end wakes (it may
    # await it by its id). Not a parent: no close policy, not among its children.
    detached_from = models.UUIDField(
        null=True,
        blank=True,
        editable=False,
        help_text="The run that started this one with run_detached (its end wakes that run).",
    )
    continued_from = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="continued_as"
    )
    start_idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    allowed_signals = models.JSONField(null=True, blank=True, help_text="None: any signal.")
    query_state = SealedJSONField(default=dict, blank=True)
    # The compaction checkpoint (engine.compaction.CompactionState.as_json): the run's
    # compacted history prefix, sealed like every payload. Deferred wherever runs are listed.
    compaction_state = SealedJSONField(null=True, blank=True)
    # How many of the history's first events are in the checkpoint (their rows are deleted):
    # the finalize decides on a fold from this and event_count without reading the blob.
    compacted_events = models.PositiveIntegerField(default=0)
    event_count = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    cancel_reason = models.TextField(null=True, blank=True)
    # The W3C trace this run belongs to (workflows/tracing.py): its trace id, and the
    # traceparent its segments' spans are children of. NULL with tracing off.
    trace_id = models.CharField(max_length=32, null=True, blank=True)
    trace_parent = models.CharField(
        max_length=55,
        null=True,
        blank=True,
        editable=False,
        help_text="W3C traceparent the run's segment spans continue (None: not traced).",
    )
    attempt = models.PositiveIntegerField(default=1, help_text="Segment attempt after failures.")
    waiting_on = models.JSONField(null=True, blank=True)
    paused_from = models.CharField(max_length=16, null=True, blank=True)
    # Paused because its tenant was deactivated (reactivation resumes these, and only these:
    # a run an operator paused stays paused).
    paused_by_deactivation = models.BooleanField(default=False)
    # The batch of the retention purge (workflows/retention.py) that took this run: it then
    # deletes what the run owns over several short transactions, and an operator's retry or
    # re-replay refuses it, so a run is never reopened with half its history gone.
    purge_batch = models.CharField(max_length=32, null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # NULLs are distinct in a unique index on every backend we test, so runs started
            # without a key never collide; a plain constraint also works on MariaDB, which
            # has no partial indexes. On PostgreSQL it is a unique index of the runs that
            # have a key (migration 0035; continued_from's too): a later migration that
            # drops it there drops an index.
            models.UniqueConstraint(
                fields=["tenant", "start_idempotency_key"], name="instance_start_idempotency_key"
            )
        ]
        # A run's every transition (start, claim, finalize) changes its status, so the new
        # row is written to every index whose condition it meets: an index that only some
        # runs need has a condition, and a run without a parent, a worker, an end, a purge
        # batch or a cancellation is not written to it. (MariaDB has no partial indexes:
        # there Django makes them whole, with the same answers.)
        indexes = [
            models.Index(fields=["workflow_id"], name="instance_workflow_id"),
            # Ready runs across tenants (the next due instant, the wake sweep) and running
            # ones (the reaper's expired leases): an ended run is not written to it.
            models.Index(
                fields=["status", "task_queue", "next_wake_at"],
                name="instance_due",
                condition=Q(status__in=[RunStatus.READY, RunStatus.RUNNING]),
            ),
            models.Index(fields=["tenant", "status", "created_at"], name="instance_listing"),
            # A worker's claimed runs (its heartbeat, the console's worker page).
            models.Index(
                fields=["assigned_to", "status"],
                name="instance_owner",
                condition=Q(assigned_to__isnull=False),
            ),
            # A claim's per-tenant turn: that tenant's due runs in one queue, most urgent
            # first, in the claim's whole order (ties by creation), so the claim reads them
            # off the index instead of sorting every due run. Only ready runs are in it: a
            # claim's or a finalize's new row is not written to it.
            models.Index(
                fields=[
                    "tenant",
                    "status",
                    "task_queue",
                    "-priority",
                    "next_wake_at",
                    "created_at",
                ],
                name="instance_tenant_due_order",
                condition=Q(status=RunStatus.READY),
            ),
            # The retention purge: a tenant's finished runs of one status, oldest end first.
            models.Index(
                fields=["tenant", "status", "completed_at"],
                name="instance_retention",
                condition=Q(completed_at__isnull=False),
            ),
            models.Index(
                fields=["tenant", "purge_batch"],
                name="instance_purge_batch",
                condition=Q(purge_batch__isnull=False),
            ),
            # A run's children (the finalize's open-children test, close policies, purges).
            models.Index(
                fields=["parent"], name="instance_parent", condition=Q(parent__isnull=False)
            ),
            # The wake sweep (workflows/store/wake.py): children that ended since its last
            # pass (their parents may wait), and waiting runs asked to cancel.
            models.Index(
                fields=["completed_at", "parent"],
                name="instance_child_ended",
                condition=Q(parent__isnull=False),
            ),
            models.Index(
                fields=["cancel_requested", "status"],
                name="instance_cancel_asked",
                condition=Q(cancel_requested=True),
            ),
            # The wake sweep: runs started detached that ended since its last pass (the runs
            # that started them may wait). Only detached runs are written to it.
            models.Index(
                fields=["completed_at", "detached_from"],
                name="instance_detached_ended",
                condition=Q(detached_from__isnull=False),
            ),
        ]
        ordering = ["-created_at"]
        permissions = [
            ("signal_workflowinstance", "Can signal runs while signal authorization is on")
        ]

    def __str__(self) -> str:
        return f"{self.definition_name} {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def start_ms(self) -> int:
        """The virtual time before the run's first event: its creation, in ms since the
        epoch (what a segment's ``RunInfo.start_ms`` is, and an exported history's)."""
        return int(self.created_at.timestamp() * 1000)

    @property
    def waiting_description(self) -> str:
        return (self.waiting_on or {}).get("description", "")

    @classmethod
    def stored_checkpoint(cls, tenant_id: uuid.UUID, instance_id: uuid.UUID | str) -> Any:
        """The run's ``compaction_state`` as a loaded instance holds it (opened)."""
        row = (
            of_tenant(cls, tenant_id)
            .filter(id=instance_id)
            .only("id", "tenant_id", "compaction_state")
            .first()
        )
        return row.compaction_state if row is not None else None

    @property
    def compaction_marker(self) -> str | None:
        """ "steps 0-999 compacted" for a run with a compacted prefix (None otherwise)."""
        if not self.compacted_events:
            return None
        return compaction.describe_count(self.compacted_events)


_READ_IT: Any = object()


def checkpoint_state(value: Any) -> compaction.CompactionState | None:
    """The :class:`engine.compaction.CompactionState` of a ``compaction_state`` value as a
    model instance holds it (None: nothing compacted). A value sealed with a key that is not
    configured raises its :class:`EncryptionKeyMissing`."""
    if value is None or value == "":
        return None
    if isinstance(value, Unopened):
        raise value.error
    return compaction.CompactionState.from_json(value)


class WorkflowEvent(SealedModel, TenantScoped):
    """One step of a run's history, as the engine's codec encodes it. Append-only, except
    that a write-ahead intent (``checksum`` empty, ``intent_at`` set) gets its outcome.
    The checksum is over the plaintext payload; the payload is sealed at rest."""

    SEAL_OWNER = ("instance_id", "step")

    # Neither foreign key has an index of its own: every read of events names the run, and
    # event_unique_step (instance, step) serves it; two indexes fewer to write at every step.
    # A tenant's events are read only by rare operator commands (rotate_keys, a tenant's
    # deletion), which scan. (MariaDB keeps the index InnoDB's foreign key to the run needs.)
    #
    # The tenant is not a constraint in the database (migration 0034): a constraint's check
    # locked the tenant's one row (FOR KEY SHARE) in every transaction that wrote an event,
    # so the transactions of every worker process wrote that row's lock, and two at once made
    # a MultiXact of it. An event's tenant is its run's: the statements that write events
    # take it from the run's row, and the run's own foreign keys (to its tenant, and the
    # event's to its run) stay. A tenant's deletion still takes its events (the ORM cascades).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    instance = models.ForeignKey(
        WorkflowInstance, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    step = models.PositiveIntegerField()
    type_code = models.PositiveSmallIntegerField(choices=EVENT_TYPE_CHOICES)
    payload = SealedTextField()
    timestamp_ms = models.BigIntegerField()
    checksum = models.CharField(max_length=64, blank=True)
    intent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["instance", "step"], name="event_unique_step")
        ]
        ordering = ["instance", "step"]

    def __str__(self) -> str:
        return f"{self.instance_id}#{self.step}"

    @classmethod
    def history(
        cls,
        tenant_id: uuid.UUID,
        instance_id: uuid.UUID | str,
        *,
        checkpoint: Any = _READ_IT,
    ) -> list[EncodedEvent]:
        """The run's whole history in step order, as the engine's codec reads it: the events
        of its compaction checkpoint (``checkpoint``: the instance's ``compaction_state``
        when the caller holds it already), then its rows. Raises
        :class:`engine.compaction.CompactionCorrupt` for a checkpoint that does not read."""
        if checkpoint is _READ_IT:
            checkpoint = WorkflowInstance.stored_checkpoint(tenant_id, instance_id)
        return compaction.with_tail(checkpoint_state(checkpoint), cls.rows(tenant_id, instance_id))

    @classmethod
    def rows(cls, tenant_id: uuid.UUID, instance_id: uuid.UUID | str) -> list[EncodedEvent]:
        """The run's event rows (the history after its compaction checkpoint)."""
        return [
            EncodedEvent(
                step,
                code,
                ts,
                open_column(cls, "payload", tenant_id, (instance_id, step), payload) or "",
                checksum,
            )
            for step, code, ts, payload, checksum in of_tenant(cls, tenant_id)
            .filter(instance_id=instance_id)
            .order_by("step")
            .values_list("step", "type_code", "timestamp_ms", "payload", "checksum")
        ]

    @property
    def event_type(self) -> str:
        try:
            return EventType(dict(EVENT_TYPE_CHOICES)[self.type_code]).value
        except (KeyError, ValueError):
            return f"unknown({self.type_code})"

    @property
    def pending(self) -> bool:
        return self.intent_at is not None and not self.checksum


class Signal(SealedModel, TenantScoped):
    SEAL_OWNER = ("instance_id",)

    instance = models.ForeignKey(WorkflowInstance, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=256)
    payload = SealedTextField(default="null")
    correlation_id = models.CharField(max_length=160, blank=True)
    sender = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["instance", "consumed_at", "id"], name="signal_pending"),
            # The wake sweep: signals that arrived since its last pass.
            models.Index(fields=["created_at"], name="signal_arrived"),
        ]
        ordering = ["id"]


class Promise(SealedModel, TenantScoped):
    SEAL_OWNER = ("instance_id", "id")

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        RESOLVED = "resolved", "resolved"
        REJECTED = "rejected", "rejected"

    id = models.CharField(primary_key=True, max_length=64)
    instance = models.ForeignKey(
        WorkflowInstance, on_delete=models.CASCADE, related_name="promises"
    )
    name = models.CharField(max_length=256)
    status = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    value = SealedTextField(blank=True, default="")
    error = SealedTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # The wake sweep: promises settled since its last pass.
        indexes = [models.Index(fields=["settled_at"], name="promise_settled")]


class UpdateRequest(SealedModel, TenantScoped):
    # The run only: a run's end fails all its pending updates in one statement.
    SEAL_OWNER = ("instance_id",)

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    instance = models.ForeignKey(WorkflowInstance, on_delete=models.CASCADE, related_name="updates")
    name = models.CharField(max_length=128)
    payload = SealedTextField(default="null")
    status = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    result = SealedTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # The wake sweep: pending updates sent since its last pass.
        indexes = [models.Index(fields=["status", "created_at"], name="update_pending")]


class ConcurrencyKey(TenantScoped):
    """A lock (``acquire_lock``): held by a workflow id until released or expired."""

    key = models.CharField(max_length=255)
    holder = models.CharField(max_length=128)
    acquired_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="concurrency_key_unique")
        ]
        # A run's end releases every lock its workflow holds.
        indexes = [models.Index(fields=["tenant", "holder"], name="concurrency_key_holder")]


class WorkflowState(SealedModel, TenantScoped):
    """Durable key/value state: a workflow's own scope (``wf:<workflow_id>``) survives
    continue-as-new; object scopes (``obj:<type>:<key>``) are shared by workflows."""

    SEAL_OWNER = ("scope", "key")

    scope = models.CharField(max_length=320)
    key = models.CharField(max_length=255)
    value = SealedTextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "scope", "key"], name="state_unique_key")
        ]


class Invocation(SealedModel, TenantScoped):
    """A call the host makes for a workflow later: ``durable_send`` (at once, at least
    once) and ``durable_schedule_invoke`` (after a delay, even if the workflow ended)."""

    # Its own id: the run link is cleared when the run is purged, the call outlives it.
    SEAL_OWNER = ("id",)

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    id = models.CharField(primary_key=True, max_length=64)
    instance = models.ForeignKey(
        WorkflowInstance, null=True, on_delete=models.SET_NULL, related_name="invocations"
    )
    service = models.CharField(max_length=128)
    operation = models.CharField(max_length=128)
    request = SealedTextField()
    idempotency_key = models.CharField(max_length=64)
    deliver_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "deliver_at"], name="invocation_due")]


class TaskCall(SealedModel, TenantScoped):
    """A durable call running as a task elsewhere (a Celery task): made with the call's
    write-ahead event, its outcome written here by the hook in the task's worker (or the
    callback endpoint), then into the run's history. States: ``engine.task_calls``."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        REPORTED = "reported", "reported"
        SETTLED = "settled", "settled"
        ABANDONED = "abandoned", "abandoned"

    SEAL_OWNER = ("instance_id", "step")

    id = models.UUIDField(primary_key=True, help_text="The task's id in the task system.")
    instance = models.ForeignKey(
        WorkflowInstance, on_delete=models.CASCADE, related_name="task_calls"
    )
    step = models.PositiveIntegerField()
    service = models.CharField(max_length=128)
    operation = models.CharField(max_length=128)
    idempotency_key = models.CharField(max_length=64)
    # The per-call secret an outcome must carry (it travels in the task's headers).
    token = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    sent = models.BooleanField(default=False)
    deadline_ms = models.BigIntegerField(null=True, blank=True)
    status = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The ABI status the task's outcome maps to."
    )
    payload = SealedTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["instance", "step"], name="task_call_step_unique")
        ]
        # The wake sweep: outcomes reported since its last pass.
        indexes = [models.Index(fields=["state", "reported_at"], name="task_call_reported")]


class AuditLog(TenantScoped):
    """What an operator did, written in the same transaction as the change itself."""

    instance = models.ForeignKey(
        WorkflowInstance, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit"
    )
    action = models.CharField(max_length=64)
    operator = models.CharField(max_length=150)
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} by {self.operator}"

    @classmethod
    def record(
        cls,
        tenant: Tenant,
        action: str,
        operator: str,
        reason: str = "",
        *,
        instance: WorkflowInstance | None = None,
        **detail: Any,
    ) -> AuditLog:
        """The audit row of a change, written in the caller's transaction so that it exists
        exactly when the change does."""
        return cls.objects.create(
            tenant=tenant,
            instance=instance,
            action=action,
            operator=operator,
            reason=reason,
            detail=detail,
        )


RETAIN_OFF = "off"


# A retention period as stored: empty (inherit), ``off`` (keep forever) or whole days.
retention_days_validator = RegexValidator(
    r"^(|off|[0-9]{1,6})$", "Give a number of days, 'off' (keep forever) or nothing (inherit)."
)


def _days_field(what: str) -> models.CharField:
    return models.CharField(
        max_length=8,
        blank=True,
        default="",
        validators=[retention_days_validator],
        help_text=f"Days {what} are kept; 'off' keeps them forever; empty inherits.",
    )


class RetentionPolicy(TenantScoped):
    """How long a tenant's data is kept, overriding the ``CLEAT_RETAIN_*`` settings: the row
    with an empty ``definition_name`` for the whole tenant, a row naming a definition for
    that definition's runs (which inherit what it leaves empty from the tenant's row).
    ``manage.py purge`` and the worker's retention duty apply them (workflows/retention.py).
    """

    definition_name = models.CharField(
        max_length=128,
        blank=True,
        default="",
        help_text="Empty: the tenant's policy; a definition's name: that definition's runs.",
    )
    finished_days = _days_field("finished runs (done, failed, terminated, cancelled)")
    dead_lettered_days = _days_field("dead-lettered runs")
    start_keys_days = _days_field("start idempotency keys")
    service_keys_days = _days_field(
        "delivered or failed service calls (durable_send, durable_schedule_invoke) and their "
        "idempotency keys (tenant policy only)"
    )
    audit_days = _days_field("audit rows (tenant policy only)")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "retention policy"
        verbose_name_plural = "retention policies"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "definition_name"], name="retention_policy_unique"
            )
        ]
        ordering = ["definition_name"]

    def __str__(self) -> str:
        return self.definition_name or "tenant policy"

    def clean(self) -> None:
        if self.definition_name and (self.service_keys_days or self.audit_days):
            raise ValidationError(
                "service keys and audit rows are kept per tenant: set them on the tenant policy"
            )


def instance_summary(instance: WorkflowInstance) -> dict[str, Any]:
    """The JSON shape of an instance shared by commands and the API."""
    return {
        "id": str(instance.id),
        "workflow_id": instance.workflow_id,
        "definition": instance.definition_name,
        "version": instance.definition_version,
        "status": instance.status,
        "result": instance.result,
        "error": instance.error,
        "error_code": instance.error_code,
        "waiting_on": instance.waiting_description or None,
        "attempt": instance.attempt,
        "generation": instance.generation,
        "events": instance.event_count,
        "compacted_events": instance.compacted_events,
        "query_state": instance.query_state,
        "parent": str(instance.parent_id) if instance.parent_id else None,
        "continued_as": _continued_as(instance),
        "created_at": instance.created_at.isoformat(),
        "completed_at": instance.completed_at.isoformat() if instance.completed_at else None,
    }


# How far a continue-as-new chain is followed to the run that ends it.
CHAIN_LIMIT = 10_000


def chain_ends(
    run_ids: Iterable[uuid.UUID], columns: Sequence[str], tenant: Any = None
) -> dict[uuid.UUID, tuple[Any, ...]]:
    """``columns`` of the run that ends each run's continue-as-new chain (the run itself, or
    the last run it was continued as), by the run's id; a run not found is left out. One
    read for all the runs, and one more for each step along the chains (none where no run
    continued as new). ``tenant``: only its runs (besides the caller's row-level
    security)."""
    runs = WorkflowInstance.objects.all() if tenant is None else of_tenant(WorkflowInstance, tenant)
    # At most one run continues a run (continued_from is unique): the model's ordering is
    # not needed in the subquery.
    successor = WorkflowInstance.objects.filter(continued_from_id=models.OuterRef("id"))
    rows = runs.annotate(
        successor=models.Subquery(successor.order_by().values("id")[:1])
    ).order_by()
    ends: dict[uuid.UUID, tuple[Any, ...]] = {}
    at = {run_id: run_id for run_id in run_ids}  # each run -> the run of its chain reached
    for _ in range(CHAIN_LIMIT):
        if not at:
            break
        found = {
            row[0]: row
            for row in rows.filter(id__in=set(at.values())).values_list("id", "successor", *columns)
        }
        going: dict[uuid.UUID, uuid.UUID] = {}
        for run_id, reached in at.items():
            row = found.get(reached)
            if row is None:
                continue
            if row[1] is None:
                ends[run_id] = row[2:]
            else:
                going[run_id] = row[1]
        at = going
    return ends


def continue_chain(
    instance: WorkflowInstance, *, limit: int, backward: bool = False
) -> list[WorkflowInstance]:
    """The runs continue-as-new links ``instance`` to, nearest first: the runs it was
    continued as, or with ``backward`` the runs it continues; at most ``limit`` of them."""
    found: list[WorkflowInstance] = []
    current = instance
    while len(found) < limit:
        if backward:
            if not current.continued_from_id:
                break
            link = models.Q(id=current.continued_from_id)
        else:
            link = models.Q(continued_from_id=current.id)
        linked = of_tenant(WorkflowInstance, instance.tenant_id).filter(link).first()
        if linked is None:
            break
        found.append(linked)
        current = linked
    return found


def _continued_as(instance: WorkflowInstance) -> str | None:
    try:
        successor = instance.continued_as
    except WorkflowInstance.DoesNotExist:
        return None
    return str(successor.id)


class StaffTenant(models.Model):
    """Binds a staff user of the operator console to one tenant: the console then shows that
    tenant only (row-level security on PostgreSQL) and no switcher. Superusers need no row:
    they may switch tenant. A staff user who is neither is refused by the console.

    Not tenant-scoped: the console reads it to decide the tenant context, before one exists.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="cleat_staff_tenant",
        help_text="A staff user (not a superuser: superusers may see every tenant).",
    )
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        related_name="staff",
        help_text="The only tenant this user sees in the console.",
    )

    class Meta:
        verbose_name = "staff tenant binding"

    def __str__(self) -> str:
        return f"{self.user} → {self.tenant}"


class CompiledArtifact(models.Model):
    """A chunk of a compiled module's serialized artifact (wasmtime's native code), shared by
    every worker through the database: the deploy compiles a version and stores its artifact
    here, so a worker whose own disk cache lacks it loads it in a moment instead of compiling
    (seconds for a Python workflow). Written and read by ``workflows.artifacts`` only.

    Not tenant-scoped: named by the module's sha256 (plus wasmtime's version and the engine
    configuration), so it is the same for every tenant that deploys the same bytes, and a
    reader must already have those bytes to ask for it. Each artifact carries an HMAC under
    the deployment's secret key, checked before wasmtime loads it.
    """

    name = models.CharField(max_length=200)
    seq = models.PositiveIntegerField()
    chunks = models.PositiveIntegerField(help_text="How many chunks the artifact has.")
    size = models.BigIntegerField(help_text="The whole artifact's size in bytes.")
    mac = models.CharField(max_length=128, help_text="HMAC-SHA256 of name and content.")
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "seq"], name="compiled_artifact_chunk")
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.seq + 1}/{self.chunks}]"


# A worker whose last heartbeat is older than this many of its own heartbeat intervals is
# stale: stopped without saying so (SIGKILL, a lost machine) or unable to reach the database.
# Three intervals is the lease (a heartbeat is due every third of it), the age at which the
# reaper takes its runs back.
STALE_AFTER_BEATS = 3


class WorkerProcess(models.Model):
    """One live ``manage.py runworker`` process, as it last reported itself. The worker
    upserts its row on every heartbeat and deletes it on a clean stop; a row left behind by a
    worker that died ages into :meth:`is_stale`.

    Fleet-wide and not tenant-scoped: workers serve every tenant. The row holds nothing of
    any tenant's (no run ids, no tenant, counts only), so it is not under row-level security;
    who may see it is decided by the console's ``view_workerprocess`` permission and the API's
    operator role. The runs a worker holds are read from the runs table, in a tenant's context.
    """

    worker_id = models.CharField(
        max_length=128, primary_key=True, help_text="host-pid-suffix, or --worker-id."
    )
    host = models.CharField(max_length=255, help_text="The machine it runs on.")
    pid = models.PositiveIntegerField(help_text="Its process id on that machine.")
    task_queues = models.JSONField(default=list, help_text="The task queues it claims from.")
    concurrency = models.PositiveIntegerField(help_text="Segments it runs at once.")
    started_at = models.DateTimeField(help_text="Its first heartbeat.")
    heartbeat_at = models.DateTimeField(help_text="Its last heartbeat (the database's clock).")
    heartbeat_interval_s = models.FloatField(help_text="Seconds between its heartbeats.")
    runs_held = models.PositiveIntegerField(
        default=0, help_text="Segments running at its last heartbeat, all tenants."
    )
    steps_total = models.BigIntegerField(default=0, help_text="Durable steps since it started.")
    steps_per_s = models.FloatField(
        default=0.0, help_text="Steps per second between its last two heartbeats."
    )
    last_error = models.TextField(blank=True, default="", help_text="Its loop's last error.")
    last_error_at = models.DateTimeField(null=True, blank=True, help_text="When it happened.")

    class Meta:
        verbose_name = "worker"
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id

    def heartbeat_age_s(self, now: Any) -> float:
        return max(0.0, (now - self.heartbeat_at).total_seconds())

    def is_stale(self, now: Any) -> bool:
        """Its heartbeat is older than STALE_AFTER_BEATS of its intervals."""
        return self.heartbeat_age_s(now) > STALE_AFTER_BEATS * self.heartbeat_interval_s
