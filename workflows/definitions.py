"""Workflow definitions: deploy and resolve, and managing deployed versions: deprecate,
restore, purge, tags, weighted routing, version garbage collection and stale-version alerts
(the reference's version handler, ``GarbageCollectVersions`` and ``CheckStaleVersions``).

Like ``workflows.services``, every function takes the tenant explicitly, runs in its tenant
context, writes the audit row in the same transaction as the change, and raises
:class:`~workflows.services.ServiceError` subclasses.

A version's runs keep a protected foreign key to it, so a purge deletes the version together
with its *finished* runs (and their histories); it is refused while any run of the version is
still active (ready, running or paused), and for a version that is not deprecated: the
deprecate-then-purge order gives one last look before anything is deleted.
"""

from __future__ import annotations

import difflib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Q, QuerySet

from engine.errors import InvalidModule
from engine.policies import check_callers
from engine.versions import NoSuchVersion, binding_problem, choose_version, resolve_plugins
from workflows.models import (
    ACTIVE_STATUSES,
    AuditLog,
    RoutingRule,
    Tenant,
    VersionTag,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.services import Conflict, InvalidInput, NotFound, check_name
from workflows.store.sql import queries
from workflows.tenancy import tenant_context

DEFAULT_MIN_VERSIONS_TO_KEEP = 3
DEFAULT_GC_MAX_AGE = timedelta(days=30)
DEFAULT_STALE_AFTER = timedelta(days=30)
DEFAULT_PURGE_AFTER = timedelta(days=90)


# --- deploy and resolve ------------------------------------------------------------------------


def deploy_definition(
    tenant: Tenant,
    name: str,
    wasm: bytes,
    *,
    version: int | None = None,
    min_version: int = 0,
    max_history_length: int = 0,
    retry_max_attempts: int | None = None,
    child_binding: str = "",
    child_versions: dict[str, int] | None = None,
    allowed_signal_callers: list[str] | None = None,
    plugin_dependencies: dict[str, str] | None = None,
) -> WorkflowDefinition:
    """Validate ``wasm`` with wasmtime (refused with its reason) and store it as the next
    version of ``name`` (or as ``version``). ``child_binding`` and ``child_versions``: how
    this version's children get their versions (:class:`engine.versions.ChildBinding`);
    ``allowed_signal_callers`` the workflows whose runs may signal its runs while signal
    authorization is on (:mod:`engine.policies`); ``plugin_dependencies`` semver
    constraints (``{"llm": ">=1.2.0"}``), resolved now to the newest configured versions
    that satisfy them (:func:`engine.versions.resolve_plugins`) and pinned."""
    from workflows.executor import get_runtime, get_services

    check_name(name, "name")
    child_versions = {} if child_versions is None else child_versions
    binding = binding_problem(child_binding, child_versions)
    if binding is not None:
        raise InvalidInput(binding[1], binding[0])
    callers = [] if allowed_signal_callers is None else allowed_signal_callers
    problem = check_callers(callers)
    if problem is not None:
        raise InvalidInput(problem, "allowed_signal_callers")
    dependencies = {} if plugin_dependencies is None else plugin_dependencies
    if not isinstance(dependencies, dict):
        raise InvalidInput(
            'plugin_dependencies must map plugin names to constraints ({"llm": ">=1.2.0"})',
            "plugin_dependencies",
        )
    try:
        plugin_versions = resolve_plugins(dependencies, get_services().plugins.versions())
    except NoSuchVersion as exc:
        raise InvalidInput(exc.message, exc.field) from None
    if not wasm:
        raise InvalidInput("the module is empty", "wasm")
    runtime = get_runtime()
    try:
        info = runtime.inspect(bytes(wasm))
    except InvalidModule as exc:
        raise InvalidInput(str(exc), "wasm") from None
    if version is not None and version < 1:
        raise InvalidInput("version must be a positive integer", "version")
    _check_packet_size(len(wasm))
    runtime.modules.share(info.sha256)  # the compile serves every worker (workflows.artifacts)
    with tenant_context(tenant.id):
        existing = WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name)
        if version is None:
            version = (existing.aggregate(v=Max("version"))["v"] or 0) + 1
        elif existing.filter(version=version).exists():
            raise Conflict(f"{name} version {version} is already deployed", "version")
        fields: dict[str, Any] = {}
        if retry_max_attempts is not None:
            fields["retry_max_attempts"] = retry_max_attempts
        return WorkflowDefinition.objects.create(
            tenant=tenant,
            name=name,
            version=version,
            wasm=bytes(wasm),
            sha256=info.sha256,
            size=info.size,
            kind=info.kind,
            abi_version=info.abi_version,
            min_version=min_version,
            entry_points=list(info.entry_points),
            max_history_length=max_history_length,
            child_binding=child_binding,
            child_versions=child_versions,
            allowed_signal_callers=callers,
            plugin_dependencies=dependencies,
            plugin_versions=plugin_versions,
            **fields,
        )


def parse_child_versions(text: str | Sequence[str]) -> dict[str, int]:
    """``child=1, other=2`` (or a list of ``child=1`` items, as the CLI's repeated flag
    gives them) as the ``child_versions`` pins a frozen binding uses."""
    items = [text] if isinstance(text, str) else list(text)
    pins: dict[str, int] = {}
    for item in (bit.strip() for piece in items for bit in piece.split(",")):
        if not item:
            continue
        name, sep, number = item.partition("=")
        if not sep or not name.strip() or not number.strip().isdigit():
            raise InvalidInput(
                f"child_versions: {item!r} is not NAME=VERSION (e.g. payment=3)", "child_versions"
            )
        pins[name.strip()] = int(number)
    return pins


def parse_plugin_dependencies(items: Sequence[str]) -> dict[str, str]:
    """``["llm:>=1.2.0", "search:^2"]`` (the deploy command's repeated flag) as
    ``plugin_dependencies``."""
    dependencies: dict[str, str] = {}
    for item in items:
        name, sep, constraint = item.partition(":")
        if not sep or not name.strip() or not constraint.strip():
            raise InvalidInput(
                f"plugin_dependencies: {item!r} is not NAME:CONSTRAINT (e.g. llm:>=1.2.0)",
                "plugin_dependencies",
            )
        dependencies[name.strip()] = constraint.strip()
    return dependencies


def _check_packet_size(size: int) -> None:
    """MySQL/MariaDB refuse a statement larger than ``max_allowed_packet`` by dropping the
    connection ("server has gone away"); say so before trying. Python components are ~20 MB."""
    if connection.vendor != "mysql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        limit = int(cursor.fetchone()[0])
    if size + 1024 * 1024 > limit:
        raise InvalidInput(
            f"the module is {size} bytes but the database accepts statements up to {limit} "
            "bytes: raise MariaDB/MySQL max_allowed_packet (e.g. to 256M)",
            "wasm",
        )


def resolve_definition(
    tenant: Tenant, name: str, *, version: int | None = None, tag: str | None = None
) -> WorkflowDefinition:
    """Explicit version, else a tag, else weighted routing rules, else the latest
    non-deprecated version."""
    defs = WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name).defer("wasm")
    rules: list[tuple[int, float]] | None = None  # (version, weight); None: not read yet
    read = queries(connection).get("definition_versions")
    if read is not None:  # the versions and the routing rules in one statement
        with connection.cursor() as cursor:
            cursor.execute(read, [tenant.id, name, tenant.id, name])
            rows = cursor.fetchall()
        deployed = {number: deprecated for number, deprecated, weight in rows if weight is None}
        rules = [(number, weight) for number, _, weight in rows if weight is not None]
    else:
        deployed = dict(defs.values_list("version", "deprecated"))
    routed = 0
    if deployed and version is None:
        if tag:
            pinned = VersionTag.objects.filter(tenant_id=tenant.id, name=name, tag=tag).first()
            if pinned is None:
                raise NotFound(f"{name} has no tag {tag!r}", field="tag")
            version = pinned.version
        else:
            if rules is None:
                rules = list(
                    RoutingRule.objects.filter(
                        tenant_id=tenant.id, name=name, weight__gt=0
                    ).values_list("version", "weight")
                )
            if rules:
                routed = random.choices(rules, weights=[weight for _, weight in rules])[0][0]
    if not deployed:
        raise unknown_name(tenant, name, "definition")
    try:
        chosen = choose_version(name, deployed, version=version, preferred=routed)
    except NoSuchVersion as exc:
        raise NotFound(exc.message, field=exc.field) from None
    return defs.get(version=chosen)


def unknown_name(tenant: Tenant, name: str, field: str) -> NotFound:
    """The 404 for a definition name nothing is deployed under, with the nearest deployed
    names when there are some: ``no workflow definition named 'ordr' (did you mean
    'order'?)``."""
    names = (
        WorkflowDefinition.objects.filter(tenant_id=tenant.id)
        .values_list("name", flat=True)
        .distinct()
        .order_by("name")[:10_000]
    )
    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return NotFound(f"no workflow definition named {name!r}{hint}", field)


# --- one version ---------------------------------------------------------------------------------


def get_definition(tenant: Tenant, name: str, version: int) -> WorkflowDefinition:
    """One version's row, without its WASM bytes."""
    found = (
        WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name, version=version)
        .defer("wasm")
        .first()
    )
    if found is None:
        if not WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name).exists():
            raise unknown_name(tenant, name, "name")
        raise NotFound(f"{name} has no version {version}", "version")
    return found


def definition_wasm(tenant: Tenant, name: str, version: int) -> tuple[WorkflowDefinition, bytes]:
    """The version and its module bytes (for download)."""
    with tenant_context(tenant.id):
        definition = get_definition(tenant, name, version)
        wasm = (
            WorkflowDefinition.objects.filter(id=definition.id).values_list("wasm", flat=True).get()
        )
    return definition, bytes(wasm)


def active_runs(tenant: Tenant, definition: WorkflowDefinition) -> int:
    return WorkflowInstance.objects.filter(
        tenant_id=tenant.id, definition_id=definition.id, status__in=ACTIVE_STATUSES
    ).count()


# --- deprecate / restore / purge -----------------------------------------------------------------


def deprecate_definition(
    tenant: Tenant, name: str, version: int, operator: str = "api", reason: str = ""
) -> WorkflowDefinition:
    """Stop routing new starts to the version (explicit ``version=`` starts still work)."""
    with tenant_context(tenant.id):
        definition = get_definition(tenant, name, version)
        if not definition.deprecated:
            WorkflowDefinition.objects.filter(id=definition.id).update(deprecated=True)
            definition.deprecated = True
            AuditLog.record(
                tenant, "deprecate_definition", operator, reason, name=name, version=version
            )
    return definition


def restore_definition(
    tenant: Tenant, name: str, version: int, operator: str = "api", reason: str = ""
) -> WorkflowDefinition:
    with tenant_context(tenant.id):
        definition = get_definition(tenant, name, version)
        if definition.deprecated:
            WorkflowDefinition.objects.filter(id=definition.id).update(deprecated=False)
            definition.deprecated = False
            AuditLog.record(
                tenant, "restore_definition", operator, reason, name=name, version=version
            )
    return definition


@dataclass(frozen=True)
class PurgeResult:
    name: str
    version: int
    runs_deleted: int


def purge_definition(
    tenant: Tenant, name: str, version: int, operator: str = "api", reason: str = ""
) -> PurgeResult:
    """Delete a deprecated version with its finished runs; refused while a run is active."""
    with tenant_context(tenant.id):
        definition = get_definition(tenant, name, version)
        return _purge(tenant, definition, operator, reason)


def _purge(
    tenant: Tenant, definition: WorkflowDefinition, operator: str, reason: str
) -> PurgeResult:
    name, version = definition.name, definition.version
    if not definition.deprecated:
        raise Conflict(f"{name} version {version} is not deprecated; deprecate it first", "version")
    active = active_runs(tenant, definition)
    if active:
        raise Conflict(
            f"{name} version {version} still has {active} active run(s); "
            "wait for them to finish or terminate them",
            "version",
        )
    runs = WorkflowInstance.objects.filter(tenant_id=tenant.id, definition_id=definition.id)
    runs_deleted = runs.count()
    runs.delete()
    VersionTag.objects.filter(tenant_id=tenant.id, name=name, version=version).delete()
    RoutingRule.objects.filter(tenant_id=tenant.id, name=name, version=version).delete()
    WorkflowDefinition.objects.filter(id=definition.id).delete()
    AuditLog.record(
        tenant,
        "purge_definition",
        operator,
        reason,
        name=name,
        version=version,
        runs_deleted=runs_deleted,
    )
    return PurgeResult(name, version, runs_deleted)


# --- tags ----------------------------------------------------------------------------------------


def list_tags(tenant: Tenant, name: str) -> list[VersionTag]:
    with tenant_context(tenant.id):
        _require_name(tenant, name)
        return list(VersionTag.objects.filter(tenant_id=tenant.id, name=name).order_by("tag"))


def set_tag(tenant: Tenant, name: str, tag: str, version: int, operator: str = "api") -> VersionTag:
    """Point ``tag`` at ``version`` (creating or moving it)."""
    check_name(tag, "tag")
    if len(tag) > 64:
        raise InvalidInput("tag must be at most 64 characters", "tag")
    with tenant_context(tenant.id):
        get_definition(tenant, name, version)
        pinned, _ = VersionTag.objects.update_or_create(
            tenant=tenant, name=name, tag=tag, defaults={"version": version}
        )
        AuditLog.record(tenant, "set_tag", operator, "", name=name, tag=tag, version=version)
    return pinned


def remove_tag(tenant: Tenant, name: str, tag: str, operator: str = "api") -> None:
    with tenant_context(tenant.id):
        deleted, _ = VersionTag.objects.filter(tenant_id=tenant.id, name=name, tag=tag).delete()
        if not deleted:
            raise NotFound(f"{name} has no tag {tag!r}", "tag")
        AuditLog.record(tenant, "remove_tag", operator, "", name=name, tag=tag)


def resolve_tag(tenant: Tenant, name: str, tag: str) -> WorkflowDefinition:
    with tenant_context(tenant.id):
        pinned = VersionTag.objects.filter(tenant_id=tenant.id, name=name, tag=tag).first()
        if pinned is None:
            _require_name(tenant, name)
            raise NotFound(f"{name} has no tag {tag!r}", "tag")
        return get_definition(tenant, name, pinned.version)


def _require_name(tenant: Tenant, name: str) -> None:
    if not WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name).exists():
        raise unknown_name(tenant, name, "name")


# --- weighted routing ----------------------------------------------------------------------------


def list_routing_rules(tenant: Tenant, name: str) -> list[RoutingRule]:
    with tenant_context(tenant.id):
        _require_name(tenant, name)
        return list(RoutingRule.objects.filter(tenant_id=tenant.id, name=name).order_by("version"))


def set_routing_rules(
    tenant: Tenant, name: str, rules: Sequence[tuple[int, float]], operator: str = "api"
) -> list[RoutingRule]:
    """Replace the routing rules of ``name``: new starts without an explicit version or tag
    pick a version at random in proportion to its weight. An empty list removes routing
    (starts take the latest non-deprecated version again)."""
    versions = [version for version, _ in rules]
    if len(set(versions)) != len(versions):
        raise InvalidInput("each version may appear in the rules only once", "rules")
    for version, weight in rules:
        if not math.isfinite(weight) or weight < 0:
            raise InvalidInput(f"the weight of version {version} must be >= 0", "rules")
    if rules and not any(weight > 0 for _, weight in rules):
        raise InvalidInput("at least one rule needs a weight above 0", "rules")
    with tenant_context(tenant.id):
        _require_name(tenant, name)
        for version, _ in rules:
            definition = (
                WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name, version=version)
                .only("deprecated")
                .first()
            )
            if definition is None:
                raise InvalidInput(f"{name} has no version {version}", "rules")
            if definition.deprecated:
                raise InvalidInput(f"{name} version {version} is deprecated", "rules")
        RoutingRule.objects.filter(tenant_id=tenant.id, name=name).delete()
        created = [
            RoutingRule.objects.create(tenant=tenant, name=name, version=version, weight=weight)
            for version, weight in rules
        ]
        AuditLog.record(
            tenant,
            "set_routing_rules",
            operator,
            "",
            name=name,
            rules=[{"version": v, "weight": w} for v, w in rules],
        )
    return created


# --- version GC and stale alerts -----------------------------------------------------------------


@dataclass(frozen=True)
class VersionRef:
    name: str
    version: int
    reason: str = ""


@dataclass
class GCResult:
    dry_run: bool
    removed: list[VersionRef] = field(default_factory=list)
    skipped: list[VersionRef] = field(default_factory=list)
    runs_deleted: int = 0


def garbage_collect_versions(
    tenant: Tenant,
    *,
    now: datetime,
    min_versions_to_keep: int = DEFAULT_MIN_VERSIONS_TO_KEEP,
    max_age: timedelta = DEFAULT_GC_MAX_AGE,
    dry_run: bool = True,
    name: str | None = None,
    operator: str = "api",
) -> GCResult:
    """Remove deprecated versions older than ``max_age`` that have no active run, keeping
    the newest ``min_versions_to_keep`` versions of every workflow and any version a tag or a
    routing rule points at. ``dry_run`` reports what would go and deletes nothing."""
    if min_versions_to_keep < 0:
        raise InvalidInput("min_versions_to_keep must be >= 0", "min_versions_to_keep")
    result = GCResult(dry_run=dry_run)
    cutoff = now - max_age
    with tenant_context(tenant.id):
        definitions = WorkflowDefinition.objects.filter(tenant_id=tenant.id).defer("wasm")
        if name is not None:
            definitions = definitions.filter(name=name)
        newest: dict[str, list[int]] = {}
        for def_name, version in definitions.order_by("name", "-version").values_list(
            "name", "version"
        ):
            newest.setdefault(def_name, []).append(version)
        kept = {
            (def_name, v)
            for def_name, versions in newest.items()
            for v in versions[:min_versions_to_keep]
        }
        pinned = _pinned_versions(tenant)
        for definition in _with_active_counts(definitions.filter(deprecated=True)):
            key = (definition.name, definition.version)
            reason = ""
            if definition.created_at > cutoff:
                reason = "younger than the maximum age"
            elif key in kept:
                reason = f"one of the newest {min_versions_to_keep} versions"
            elif key in pinned:
                reason = "a tag or routing rule points at it"
            elif definition.active:
                reason = f"{definition.active} active run(s)"
            if reason:
                result.skipped.append(VersionRef(*key, reason))
                continue
            if not dry_run:
                purged = _purge(tenant, definition, operator, "version garbage collection")
                result.runs_deleted += purged.runs_deleted
            result.removed.append(VersionRef(*key))
    return result


def _pinned_versions(tenant: Tenant) -> set[tuple[str, int]]:
    tags = VersionTag.objects.filter(tenant_id=tenant.id).values_list("name", "version")
    rules = RoutingRule.objects.filter(tenant_id=tenant.id).values_list("name", "version")
    return {*tags, *rules}


def _with_active_counts(
    definitions: QuerySet[WorkflowDefinition],
) -> list[WorkflowDefinition]:
    """The versions, each with ``active``: how many of its runs are ready, running or paused."""
    return list(
        definitions.annotate(
            active=Count(
                "workflowinstance",
                filter=Q(workflowinstance__status__in=ACTIVE_STATUSES),
            )
        ).order_by("name", "version")
    )


@dataclass(frozen=True)
class StaleVersionAlert:
    name: str
    version: int
    deprecated: bool
    active_instances: int
    days_since_created: int
    message: str


def check_stale_versions(
    tenant: Tenant,
    *,
    now: datetime,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
    purge_after: timedelta = DEFAULT_PURGE_AFTER,
) -> list[StaleVersionAlert]:
    """Versions that need attention: non-deprecated versions older than ``stale_after`` that
    still have active runs while a newer version exists (migration candidates), and deprecated
    versions older than ``purge_after`` with no active run (garbage-collection candidates)."""
    alerts: list[StaleVersionAlert] = []
    with tenant_context(tenant.id):
        definitions = WorkflowDefinition.objects.filter(tenant_id=tenant.id).defer("wasm")
        latest: dict[str, int] = {}
        for def_name, version in definitions.values_list("name", "version"):
            latest[def_name] = max(latest.get(def_name, 0), version)
        for definition in _with_active_counts(definitions):
            age = now - definition.created_at
            days = max(0, age.days)
            if (
                not definition.deprecated
                and age > stale_after
                and definition.active
                and definition.version < latest[definition.name]
            ):
                message = (
                    f"{definition.name} v{definition.version} is {days} days old and still has "
                    f"{definition.active} active run(s); v{latest[definition.name]} is the "
                    "latest: consider migrating them"
                )
            elif definition.deprecated and age > purge_after and not definition.active:
                message = (
                    f"{definition.name} v{definition.version} is deprecated, {days} days old "
                    "and has no active run: it can be purged"
                )
            else:
                continue
            alerts.append(
                StaleVersionAlert(
                    name=definition.name,
                    version=definition.version,
                    deprecated=definition.deprecated,
                    active_instances=definition.active,
                    days_since_created=days,
                    message=message,
                )
            )
    return alerts
