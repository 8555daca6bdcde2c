"""The API's viewsets. Reads are declarative querysets, always filtered by the caller's tenant
(MariaDB and SQLite have no row-level security); every state change is an action that calls
``workflows.services`` or ``workflows.definitions`` and returns the serializer's data.

Each request is authenticated first (the API key names the tenant), then its handler runs
inside ``tenant_context`` -- one transaction with the tenant set for PostgreSQL's row-level
security, rolled back whole if anything raises. The one exception is sending an update and
waiting for its answer: the update must be committed for a worker to see it, so that handler
(``own_transactions``) lets the service open its own tenant contexts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import timedelta
from typing import Any, TypeVar

from django.db.models import Count, Q, QuerySet
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from prometheus_client import Counter, Histogram
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from workflows import definitions, retention, services
from workflows.api import serializers as s
from workflows.api.authentication import ApiIdentity, identity_of
from workflows.api.errors import InvalidRequest, PayloadTooLarge
from workflows.api.pagination import (
    ChainPagination,
    DefinitionPagination,
    EventPagination,
    RunPagination,
    WorkerPagination,
)
from workflows.api.parsers import (
    LimitedJSONParser,
    OctetStreamParser,
    WasmParser,
    max_body_bytes,
    max_module_bytes,
)
from workflows.api.permissions import HasRole
from workflows.models import (
    ACTIVE_STATUSES,
    ApiKey,
    Promise,
    Role,
    RoutingRule,
    VersionTag,
    WorkerProcess,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.store.workers import fleet_now
from workflows.tenancy import of_tenant, tenant_context

API_REQUESTS = Counter(
    "cleat_api_requests_total", "REST API requests", ["method", "endpoint", "status"]
)
API_SECONDS = Histogram("cleat_api_request_seconds", "REST API request duration", ["method"])

# Every label value comes from a fixed set: anyone can send a request (no key needed to be
# counted), so a label copied from it would let them grow /metrics without bound. The
# endpoint label is the route's name (viewset and action), never the path.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
KNOWN_STATUSES = frozenset(
    {200, 201, 202, 204, 301, 302, 304, 400, 401, 403, 404, 405, 406, 409, 413, 415, 429, 500}
    | {502, 503, 504}
)


def method_label(method: str | None) -> str:
    return method if method in KNOWN_METHODS else "other"


def status_label(code: int) -> str:
    """The code itself when the API answers it, else its class (``5xx``)."""
    return str(code) if code in KNOWN_STATUSES else f"{min(max(code // 100, 1), 5)}xx"


NAME_REGEX = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
TAG_REGEX = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"

F = TypeVar("F", bound=Callable[..., Any])


def own_transactions(handler: F) -> F:
    """Mark a handler that must not run inside the request's transaction (it calls services
    that commit and then wait for a worker)."""
    handler.own_transactions = True  # type: ignore[attr-defined]
    return handler


def _errors(*codes: int) -> Callable[[F], F]:
    """The error statuses an action can answer besides the common ones (schema only)."""

    def mark(handler: F) -> F:
        handler.cleat_errors = frozenset(codes)  # type: ignore[attr-defined]
        return handler

    return mark


class TenantViewSet(viewsets.GenericViewSet):
    """Authenticated, role-checked, throttled per key, run in the caller's tenant context."""

    permission_classes = [HasRole]
    parser_classes = [LimitedJSONParser]
    # Role an unsafe (POST/PUT/DELETE) action needs; unnamed ones need "operator". Safe
    # methods need "read_only".
    action_roles: dict[str, str] = {}

    @property
    def identity(self) -> ApiIdentity:
        return identity_of(self.request)

    @property
    def tenant(self) -> Any:
        return self.identity.tenant

    @property
    def operator(self) -> str:
        return self.identity.operator

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # DRF's dispatch inside a scope that ``initial`` enters the tenant context in, once
        # authentication has named the tenant. The handler and the rendering (which may read
        # lazily loaded rows) run inside it; ``handle_exception`` leaves it first, with the
        # error, so that the handler's writes roll back. A failed render or commit is answered
        # like any other error.
        started = time.monotonic()
        with ExitStack() as self._tenant_scope:
            response = super().dispatch(request, *args, **kwargs)
            try:
                if isinstance(response, Response):
                    response.render()
                self._tenant_scope.close()
            except Exception as exc:
                response = self.finalize_response(
                    self.request, self.handle_exception(exc), *args, **kwargs
                )
        method = method_label(self.request.method)
        action = self.action if method != "other" else None  # None for a method not routed
        API_REQUESTS.labels(
            method,
            getattr(self, "basename", "?") + "." + str(action),
            status_label(response.status_code),
        ).inc()
        API_SECONDS.labels(method).observe(time.monotonic() - started)
        return response

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        length = request.META.get("CONTENT_LENGTH") or "0"
        limit = self.body_limit()
        if length.isdigit() and int(length) > limit:
            raise PayloadTooLarge(f"The request body is larger than {limit} bytes.")
        handler = getattr(self, request.method.lower(), None)
        if not getattr(handler, "own_transactions", False):
            self._tenant_scope.enter_context(tenant_context(self.tenant.id))

    def handle_exception(self, exc: Exception) -> Any:
        # Leave the tenant context with the error, so that its transaction rolls back; a
        # policy's refusal keeps its audit row, written after the rollback.
        self._tenant_scope.__exit__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, services.Forbidden):
            services.keep_refusal_audit(self.tenant, exc)
        return super().handle_exception(exc)

    def body_limit(self) -> int:
        return max_body_bytes()

    def validated(self, serializer_class: type[BaseSerializer], data: Any = None) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data if data is None else data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def params(self, serializer_class: type[BaseSerializer]) -> dict[str, Any]:
        """The query parameters, validated strictly: a plain dict, so that ``?name=`` is an
        empty name (refused) rather than DRF's form semantics of "not given"."""
        return self.validated(serializer_class, dict(self.request.query_params.items()))

    def paginated(self, queryset: QuerySet[Any], serializer_class: type[BaseSerializer]) -> Any:
        page = self.paginate_queryset(queryset)
        data = serializer_class(page, many=True, context=self.get_serializer_context()).data
        return self.get_paginated_response(data)


# --- definitions ---------------------------------------------------------------------------------


def _with_active_runs(queryset: QuerySet[WorkflowDefinition]) -> QuerySet[WorkflowDefinition]:
    return queryset.defer("wasm").annotate(
        active_runs=Count(
            "workflowinstance", filter=Q(workflowinstance__status__in=ACTIVE_STATUSES)
        )
    )


@extend_schema(tags=["definitions"])
class DefinitionViewSet(TenantViewSet):
    """Deployed workflow definitions, by name."""

    lookup_field = "name"
    lookup_value_regex = NAME_REGEX
    serializer_class = s.DefinitionSerializer
    pagination_class = DefinitionPagination
    action_roles = {
        "create": Role.ADMIN,
        "tags": Role.ADMIN,
        "tag": Role.ADMIN,
        "routing": Role.ADMIN,
        "gc": Role.ADMIN,
    }

    def get_parsers(self) -> list[Any]:
        # Called before DRF sets self.action; self.request is still Django's request then.
        action_name = getattr(self, "action", None)
        request = getattr(self, "request", None)
        if action_name is None and request is not None:
            action_name = self.action_map.get(request.method.lower())
        if action_name == "create":
            return [MultiPartParser(), WasmParser(), OctetStreamParser()]
        return super().get_parsers()

    def body_limit(self) -> int:
        return max_module_bytes() if self.action == "create" else max_body_bytes()

    def get_queryset(self) -> QuerySet[WorkflowDefinition]:
        if getattr(self, "swagger_fake_view", False):
            return WorkflowDefinition.objects.none()
        return _with_active_runs(of_tenant(WorkflowDefinition, self.tenant))

    @extend_schema(
        summary="List deployed versions",
        parameters=[s.DefinitionListQuerySerializer],
        responses=s.DefinitionSerializer(many=True),
    )
    def list(self, request: Request) -> Response:
        query = self.params(s.DefinitionListQuerySerializer)
        queryset = self.get_queryset()
        if query.get("name"):
            queryset = queryset.filter(name=query["name"])
        if query.get("deprecated") is not None:
            queryset = queryset.filter(deprecated=query["deprecated"])
        return self.paginated(queryset, s.DefinitionSerializer)

    @extend_schema(
        summary="Deploy a version",
        description=(
            "Upload the module as multipart form data (field `wasm`, with `name` and the "
            "options as form fields), or send the raw bytes (`Content-Type: application/wasm` "
            "or `application/octet-stream`) with `name` and the options as query parameters. "
            "wasmtime validates the module at once; an invalid one is refused with its reason."
        ),
        request={
            "multipart/form-data": s.DeployUploadSerializer,
            "application/wasm": OpenApiTypes.BINARY,
            "application/octet-stream": OpenApiTypes.BINARY,
        },
        parameters=[
            OpenApiParameter("name", str, description="Raw body only: the workflow name."),
            OpenApiParameter("version", int, description="Raw body only."),
            OpenApiParameter("min_version", int, description="Raw body only."),
            OpenApiParameter("max_history_length", int, description="Raw body only."),
            OpenApiParameter("retry_max_attempts", int, description="Raw body only."),
            OpenApiParameter("child_binding", str, description="Raw body only."),
            OpenApiParameter("child_versions", str, description="Raw body only: a JSON object."),
            OpenApiParameter(
                "allowed_signal_callers", str, description="Raw body only: a JSON array."
            ),
            OpenApiParameter(
                "plugin_dependencies", str, description="Raw body only: a JSON object."
            ),
        ],
        responses={201: s.DefinitionSerializer},
    )
    @_errors(409, 413, 415)
    def create(self, request: Request) -> Response:
        if isinstance(request.data, bytes):
            options = self.params(s.DeployOptionsSerializer)
            wasm = request.data
        else:
            options = self.validated(s.DeployUploadSerializer)
            upload = options.pop("wasm")
            if upload.size > max_module_bytes():
                raise PayloadTooLarge(f"The module is larger than {max_module_bytes()} bytes.")
            wasm = upload.read()
        name = options.pop("name")
        definition = definitions.deploy_definition(self.tenant, name, wasm, **options)
        definition.active_runs = 0  # type: ignore[attr-defined]
        return Response(s.DefinitionSerializer(definition).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="A workflow: its versions, tags and routing",
        responses=s.DefinitionNameSerializer,
    )
    def retrieve(self, request: Request, name: str) -> Response:
        rows = list(
            of_tenant(WorkflowDefinition, self.tenant)
            .filter(name=name)
            .order_by("version")
            .values_list("version", "deprecated")
        )
        if not rows:
            raise definitions.unknown_name(self.tenant, name, "name")
        tags = of_tenant(VersionTag, self.tenant).filter(name=name)
        rules = of_tenant(RoutingRule, self.tenant).filter(name=name)
        return Response(
            {
                "name": name,
                "latest_version": rows[-1][0],
                "versions": [v for v, _ in rows],
                "deprecated_versions": [v for v, deprecated in rows if deprecated],
                "tags": {t.tag: t.version for t in tags.order_by("tag")},
                "routing": [
                    {"version": r.version, "weight": r.weight} for r in rules.order_by("version")
                ],
            }
        )

    @extend_schema(methods=["GET"], summary="List tags", responses=s.TagSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        summary="Point a tag at a version",
        request=s.SetTagSerializer,
        responses=s.TagSerializer,
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def tags(self, request: Request, name: str) -> Response:
        if request.method == "GET":
            tags = definitions.list_tags(self.tenant, name)
            return Response(s.TagSerializer(tags, many=True).data)
        body = self.validated(s.SetTagSerializer)
        pinned = definitions.set_tag(self.tenant, name, body["tag"], body["version"], self.operator)
        return Response(s.TagSerializer(pinned).data)

    @extend_schema(
        methods=["GET"],
        summary="Resolve a tag to its version",
        responses=s.DefinitionSerializer,
    )
    @extend_schema(methods=["DELETE"], summary="Remove a tag", responses={204: None})
    @action(
        detail=True,
        methods=["get", "delete"],
        url_path=rf"tags/(?P<tag>{TAG_REGEX})",
        pagination_class=None,
    )
    def tag(self, request: Request, name: str, tag: str) -> Response:
        if request.method == "GET":
            definition = definitions.resolve_tag(self.tenant, name, tag)
            found = _with_active_runs(
                of_tenant(WorkflowDefinition, self.tenant).filter(id=definition.id)
            ).get()
            return Response(s.DefinitionSerializer(found).data)
        definitions.remove_tag(self.tenant, name, tag, self.operator)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        methods=["GET"], summary="Weighted routing rules", responses=s.RoutingRulesSerializer
    )
    @extend_schema(
        methods=["PUT"],
        summary="Replace the weighted routing rules",
        description=(
            "New starts that name neither a version nor a tag pick a version at random in "
            "proportion to its weight. An empty list removes routing."
        ),
        request=s.RoutingRulesSerializer,
        responses=s.RoutingRulesSerializer,
    )
    @action(detail=True, methods=["get", "put"], pagination_class=None)
    def routing(self, request: Request, name: str) -> Response:
        if request.method == "GET":
            rules = definitions.list_routing_rules(self.tenant, name)
        else:
            body = self.validated(s.RoutingRulesSerializer)
            pairs = [(rule["version"], rule["weight"]) for rule in body["rules"]]
            rules = definitions.set_routing_rules(self.tenant, name, pairs, self.operator)
        return Response({"rules": s.RoutingRuleSerializer(rules, many=True).data})

    @extend_schema(
        summary="Garbage-collect old deprecated versions",
        description=(
            "Removes deprecated versions older than `max_age_days` with no active run, keeping "
            "the newest `min_versions_to_keep` of each workflow and every version a tag or a "
            "routing rule points at. `dry_run` (the default) only reports."
        ),
        request=s.GCRequestSerializer,
        responses=s.GCResultSerializer,
    )
    @action(detail=False, methods=["post"])
    def gc(self, request: Request) -> Response:
        body = self.validated(s.GCRequestSerializer)
        result = definitions.garbage_collect_versions(
            self.tenant,
            now=timezone.now(),
            min_versions_to_keep=body["min_versions_to_keep"],
            max_age=timedelta(days=body["max_age_days"]),
            dry_run=body["dry_run"],
            name=body.get("name"),
            operator=self.operator,
        )
        return Response(s.GCResultSerializer(result).data)

    @extend_schema(
        summary="Stale-version alerts",
        description=(
            "Non-deprecated versions older than `stale_after_days` that still have active runs "
            "while a newer version exists, and deprecated versions older than "
            "`purge_after_days` with no active run."
        ),
        parameters=[s.StaleQuerySerializer],
        responses=s.StaleAlertSerializer(many=True),
    )
    @action(detail=False, methods=["get"], pagination_class=None)
    def stale(self, request: Request) -> Response:
        query = self.params(s.StaleQuerySerializer)
        alerts = definitions.check_stale_versions(
            self.tenant,
            now=timezone.now(),
            stale_after=timedelta(days=query["stale_after_days"]),
            purge_after=timedelta(days=query["purge_after_days"]),
        )
        return Response(s.StaleAlertSerializer(alerts, many=True).data)


@extend_schema(
    tags=["definitions"],
    parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH, pattern=f"^{NAME_REGEX}$")],
)
class DefinitionVersionViewSet(TenantViewSet):
    """The versions of one workflow."""

    lookup_field = "version"
    lookup_value_regex = r"[0-9]{1,10}"
    serializer_class = s.DefinitionSerializer
    pagination_class = DefinitionPagination
    action_roles = {"deprecate": Role.ADMIN, "restore": Role.ADMIN, "purge": Role.ADMIN}

    def get_queryset(self) -> QuerySet[WorkflowDefinition]:
        if getattr(self, "swagger_fake_view", False):
            return WorkflowDefinition.objects.none()
        return _with_active_runs(
            of_tenant(WorkflowDefinition, self.tenant).filter(name=self.kwargs["name"])
        )

    def _version(self) -> int:
        version = int(self.kwargs["version"])
        if not 1 <= version <= s.INT32_MAX:
            raise services.NotFound(f"{self.kwargs['name']} has no version {version}", "version")
        return version

    def _one(self) -> WorkflowDefinition:
        found = self.get_queryset().filter(version=self._version()).first()
        if found is None:
            # Says which is missing, the workflow or the version.
            definitions.get_definition(self.tenant, self.kwargs["name"], self._version())
            raise services.NotFound(f"{self.kwargs['name']} has no version {self._version()}")
        return found

    @extend_schema(summary="List the versions of a workflow")
    def list(self, request: Request, name: str) -> Response:
        queryset = self.get_queryset()
        if not queryset.exists():
            raise services.NotFound(f"no workflow definition named {name!r}", "name")
        return self.paginated(queryset, s.DefinitionSerializer)

    @extend_schema(
        summary="A version's metadata",
        parameters=[OpenApiParameter("version", int, OpenApiParameter.PATH)],
    )
    def retrieve(self, request: Request, name: str, version: str) -> Response:
        return Response(s.DefinitionSerializer(self._one()).data)

    @extend_schema(
        summary="Download a version's module",
        parameters=[OpenApiParameter("version", int, OpenApiParameter.PATH)],
        responses={
            (200, "application/wasm"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The module's bytes."
            )
        },
    )
    @action(detail=True, methods=["get"])
    def download(self, request: Request, name: str, version: str) -> HttpResponse:
        definition, wasm = definitions.definition_wasm(self.tenant, name, self._version())
        response = HttpResponse(wasm, content_type="application/wasm")
        response["Content-Disposition"] = (
            f'attachment; filename="{definition.name}-v{definition.version}.wasm"'
        )
        response["ETag"] = f'"{definition.sha256}"'
        return response

    @extend_schema(
        summary="Deprecate a version (new starts stop routing to it)",
        parameters=[OpenApiParameter("version", int, OpenApiParameter.PATH)],
        request=s.ReasonSerializer,
        responses=s.DefinitionSerializer,
    )
    @action(detail=True, methods=["post"])
    def deprecate(self, request: Request, name: str, version: str) -> Response:
        body = self.validated(s.ReasonSerializer)
        definitions.deprecate_definition(
            self.tenant, name, self._version(), self.operator, body["reason"]
        )
        return Response(s.DefinitionSerializer(self._one()).data)

    @extend_schema(
        summary="Restore a deprecated version",
        parameters=[OpenApiParameter("version", int, OpenApiParameter.PATH)],
        request=s.ReasonSerializer,
        responses=s.DefinitionSerializer,
    )
    @action(detail=True, methods=["post"])
    def restore(self, request: Request, name: str, version: str) -> Response:
        body = self.validated(s.ReasonSerializer)
        definitions.restore_definition(
            self.tenant, name, self._version(), self.operator, body["reason"]
        )
        return Response(s.DefinitionSerializer(self._one()).data)

    @extend_schema(
        summary="Purge a deprecated version and its finished runs",
        description="Refused (409) while the version is not deprecated or has an active run.",
        parameters=[OpenApiParameter("version", int, OpenApiParameter.PATH)],
        request=s.ReasonSerializer,
        responses=s.PurgeResultSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def purge(self, request: Request, name: str, version: str) -> Response:
        body = self.validated(s.ReasonSerializer)
        result = definitions.purge_definition(
            self.tenant, name, self._version(), self.operator, body["reason"]
        )
        return Response(s.PurgeResultSerializer(result).data)


# --- runs ----------------------------------------------------------------------------------------


@extend_schema(tags=["workflows"])
class WorkflowViewSet(TenantViewSet):
    """Workflow runs: start, list, inspect, and act on them."""

    lookup_field = "id"
    lookup_url_kwarg = "run_id"
    lookup_value_regex = r"[^/]+"
    serializer_class = s.RunSerializer
    pagination_class = RunPagination
    action_roles = {
        "force_complete": Role.ADMIN,
        "force_fail": Role.ADMIN,
        "re_replay": Role.ADMIN,
        "move_version": Role.ADMIN,
    }

    def get_queryset(self) -> QuerySet[WorkflowInstance]:
        if getattr(self, "swagger_fake_view", False):
            return WorkflowInstance.objects.none()
        return (
            of_tenant(WorkflowInstance, self.tenant)
            .select_related("continued_as")
            .defer("compaction_state", "continued_as__compaction_state")
        )

    def _run(self, run_id: str) -> WorkflowInstance:
        found = services.get_instance(self.tenant, run_id)
        return self.get_queryset().get(id=found.id)

    def _respond(self, run_id: str, code: int = status.HTTP_200_OK) -> Response:
        return Response(s.RunSerializer(self._run(run_id)).data, status=code)

    @extend_schema(
        summary="List runs",
        parameters=[s.RunFilterSerializer],
        responses=s.RunSerializer(many=True),
    )
    def list(self, request: Request) -> Response:
        query = self.params(s.RunFilterSerializer)
        runs = self.get_queryset()
        for key, lookup in (
            ("status", "status"),
            ("definition", "definition_name"),
            ("version", "definition_version"),
            ("error_code", "error_code"),
            ("task_queue", "task_queue"),
            ("created_after", "created_at__gte"),
            ("created_before", "created_at__lt"),
        ):
            if query.get(key) is not None:
                runs = runs.filter(**{lookup: query[key]})
        if query.get("search"):
            text = query["search"]
            runs = runs.filter(Q(input__icontains=text) | Q(error__icontains=text))
        return self.paginated(runs, s.RunSerializer)

    @extend_schema(
        summary="Start a run",
        description=(
            "201 with the new run; with an `idempotency_key` already used, 200 with the run "
            "that key started (nothing new is started)."
        ),
        request=s.StartRunSerializer,
        responses={201: s.RunSerializer, 200: s.RunSerializer},
    )
    @_errors(413)
    def create(self, request: Request) -> Response:
        body = self.validated(s.StartRunSerializer)
        try:
            instance, created = services.start_workflow(
                self.tenant,
                body["definition"],
                s.json_text(body["input"]),
                version=body.get("version"),
                tag=body.get("tag"),
                idempotency_key=body.get("idempotency_key"),
                priority=body["priority"],
                task_queue=body["task_queue"],
                workflow_id=body.get("workflow_id"),
                entry_point=body["entry_point"],
                max_priority=services.priority_ceiling(self.identity.role),
                # W3C Trace Context: a malformed header is ignored, never a 400.
                traceparent=request.headers.get("traceparent"),
            )
        except services.NotFound as exc:
            # The request names something that does not exist: bad input, not a missing URL.
            raise InvalidRequest(exc.message, "unknown_definition", exc.field) from None
        return self._respond(
            str(instance.id), status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(summary="A run")
    def retrieve(self, request: Request, run_id: str) -> Response:
        return self._respond(run_id)

    @extend_schema(
        summary="A run's event history",
        description=(
            "The run's event rows, in step order. A run whose history was compacted "
            "(`compacted_events` > 0 on the run) keeps its first `compacted_events` events "
            "in its checkpoint: this list then starts at that step; `GET .../history` "
            "returns every event, expanded from the checkpoint."
        ),
        parameters=[s.EventsQuerySerializer],
        responses=s.EventSerializer(many=True),
    )
    @action(
        detail=True,
        methods=["get"],
        pagination_class=EventPagination,
        serializer_class=s.EventSerializer,
    )
    def events(self, request: Request, run_id: str) -> Response:
        query = self.params(s.EventsQuerySerializer)
        run = services.get_instance(self.tenant, run_id)
        events = of_tenant(WorkflowEvent, self.tenant).filter(instance_id=run.id)
        page = self.paginate_queryset(events)
        context = {**self.get_serializer_context(), "decoded": query["decoded"]}
        return self.get_paginated_response(s.EventSerializer(page, many=True, context=context).data)

    @extend_schema(
        summary="Export a run's history for replay tests",
        description=(
            "The whole history with what replaying it needs (`format` `cleat-history/1`, "
            "the same document as `manage.py export_history`): replay it against a new build "
            "with `engine.testing.replay` or `cleat_workflow.testing.replay`."
        ),
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def history(self, request: Request, run_id: str) -> Response:
        return Response(services.export_history(self.tenant, run_id).to_json())

    @extend_schema(
        summary="Read a run's query state",
        description="With `key`: that key's value (404 if unset); without: the whole state.",
        parameters=[s.QueryStateQuerySerializer],
        responses=s.QueryStateSerializer,
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def query(self, request: Request, run_id: str) -> Response:
        key = self.params(s.QueryStateQuerySerializer).get("key")
        value = services.query_state(self.tenant, run_id, key)
        value = (
            s.parse_state(value)
            if key is not None
            else {k: s.parse_state(v) for k, v in value.items()}
        )
        return Response(s.QueryStateSerializer({"key": key, "value": value}).data)

    @extend_schema(
        summary="Runs started by this run (its children)",
        responses=s.RunSerializer(many=True),
    )
    @action(detail=True, methods=["get"])
    def children(self, request: Request, run_id: str) -> Response:
        run = services.get_instance(self.tenant, run_id)
        return self.paginated(self.get_queryset().filter(parent_id=run.id), s.RunSerializer)

    @extend_schema(
        summary="The continue-as-new chain of this run's workflow id, oldest first",
        responses=s.RunSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=ChainPagination)
    def chain(self, request: Request, run_id: str) -> Response:
        run = services.get_instance(self.tenant, run_id)
        runs = self.get_queryset().filter(workflow_id=run.workflow_id)
        return self.paginated(runs, s.RunSerializer)

    @extend_schema(
        summary="Send a signal",
        request=s.SignalRequestSerializer,
        responses={202: s.SignalSerializer},
    )
    @_errors(409, 413)
    @action(detail=True, methods=["post"])
    def signal(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.SignalRequestSerializer)
        sent = services.signal_workflow(
            self.tenant,
            run_id,
            body["name"],
            s.json_text(body["payload"]),
            permitted=self._may_signal(),
            caller=self.operator,
        )
        return Response(s.SignalSerializer(sent).data, status=status.HTTP_202_ACCEPTED)

    def _may_signal(self) -> bool:
        """The caller's permission to signal under signal authorization: an API key's
        ``may_signal``; a console user's ``workflows.signal_workflowinstance``."""
        key_id = self.identity.key_id
        if key_id is None:
            return bool(self.request.user.has_perm("workflows.signal_workflowinstance"))
        return bool(
            of_tenant(ApiKey, self.tenant)
            .filter(id=key_id)
            .values_list("may_signal", flat=True)
            .first()
        )

    def _reason(self) -> str:
        return str(self.validated(s.ReasonSerializer)["reason"])

    @extend_schema(
        summary="Request cancellation (the workflow sees it and winds down)",
        request=s.ReasonSerializer,
        responses=s.RunSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, run_id: str) -> Response:
        services.cancel_workflow(self.tenant, run_id, self._reason(), self.operator)
        return self._respond(run_id)

    @extend_schema(
        summary="Terminate at once", request=s.ReasonSerializer, responses=s.RunSerializer
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def terminate(self, request: Request, run_id: str) -> Response:
        services.terminate_workflow(self.tenant, run_id, self._reason(), self.operator)
        return self._respond(run_id)

    @extend_schema(
        summary="Pause a ready run", request=s.ReasonSerializer, responses=s.RunSerializer
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, run_id: str) -> Response:
        services.pause_workflow(self.tenant, run_id, self.operator, self._reason())
        return self._respond(run_id)

    @extend_schema(
        summary="Resume a paused run", request=s.ReasonSerializer, responses=s.RunSerializer
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, run_id: str) -> Response:
        services.resume_workflow(self.tenant, run_id, self.operator, self._reason())
        return self._respond(run_id)

    @extend_schema(
        summary="Retry a failed or dead-lettered run (it replays its history)",
        description="The answer is the run, with what the retry does (`retry.effect`): "
        "by default the history is replayed, so a run that failed on a recorded permanent "
        "failure fails again unless `mode` is `reexecute_last_call`.",
        request=s.RetryRequestSerializer,
        responses=s.RetriedRunSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.RetryRequestSerializer)
        retried = services.retry_workflow(
            self.tenant, run_id, self.operator, body["reason"], mode=body["mode"]
        )
        run = self._run(run_id)
        run.retry_plan = retried.retry_plan  # type: ignore[attr-defined]
        return Response(s.RetriedRunSerializer(run).data)

    @extend_schema(
        summary="Force-complete with a result (admin)",
        description="409 when `generation` is not the run's current generation.",
        request=s.ForceCompleteSerializer,
        responses=s.RunSerializer,
    )
    @_errors(409, 413)
    @action(detail=True, methods=["post"], url_path="force-complete")
    def force_complete(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.ForceCompleteSerializer)
        services.force_complete(
            self.tenant,
            run_id,
            body["generation"],
            s.json_text(body["result"]),
            self.operator,
            body["reason"],
        )
        return self._respond(run_id)

    @extend_schema(
        summary="Force-fail with an error (admin)",
        description="409 when `generation` is not the run's current generation.",
        request=s.ForceFailSerializer,
        responses=s.RunSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"], url_path="force-fail")
    def force_fail(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.ForceFailSerializer)
        services.force_fail(
            self.tenant,
            run_id,
            body["generation"],
            body["message"],
            body["code"],
            self.operator,
            body["reason"],
        )
        return self._respond(run_id)

    @extend_schema(
        summary="Re-execute from the existing history (admin)",
        description="409 when `generation` is stale or the run is running or paused.",
        request=s.ReReplaySerializer,
        responses=s.RunSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"], url_path="re-replay")
    def re_replay(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.ReReplaySerializer)
        services.re_replay(self.tenant, run_id, body["generation"], self.operator, body["reason"])
        return self._respond(run_id)

    @extend_schema(
        summary="Move the run to another version of its definition (admin)",
        description=(
            "A ready, paused or dead-lettered run replays its history on `version` from its "
            "next segment on. 404 when the version is not deployed; 409 when the run is "
            "running or finished, `generation` is stale, or the version cannot take the run "
            "over (the message names the first incompatibility: an entry point or update "
            "handler it lacks, a min_version above the run's version)."
        ),
        request=s.MoveVersionSerializer,
        responses=s.RunSerializer,
    )
    @_errors(404, 409)
    @action(detail=True, methods=["post"], url_path="move-version")
    def move_version(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.MoveVersionSerializer)
        services.move_to_version(
            self.tenant,
            run_id,
            body["version"],
            self.operator,
            body["reason"],
            generation=body.get("generation"),
        )
        return self._respond(run_id)

    @extend_schema(
        summary="Send an update and wait for the handler's answer",
        description=(
            "200 with the answer (`status` done or failed) when the workflow's update handler "
            "answers within `wait_seconds`; 202 with the pending update otherwise."
        ),
        request=s.UpdateRequestSerializer,
        responses={200: s.UpdateSerializer, 202: s.UpdateSerializer},
    )
    @_errors(409, 413)
    @own_transactions
    @action(detail=True, methods=["post"], url_path="update")
    def send_update(self, request: Request, run_id: str) -> Response:
        body = self.validated(s.UpdateRequestSerializer)
        update = services.send_update(
            self.tenant,
            run_id,
            body["name"],
            s.json_text(body["payload"]),
            wait_s=body["wait_seconds"],
        )
        pending = update.status == update.State.PENDING
        return Response(
            s.UpdateSerializer(update).data,
            status=status.HTTP_202_ACCEPTED if pending else status.HTTP_200_OK,
        )


# --- promises ------------------------------------------------------------------------------------


@extend_schema(tags=["promises"])
class PromiseViewSet(TenantViewSet):
    """Promises a run waits on: read, resolve, reject."""

    lookup_field = "id"
    lookup_url_kwarg = "promise_id"
    lookup_value_regex = r"[A-Za-z0-9_.:-]{1,64}"
    serializer_class = s.PromiseSerializer

    def get_queryset(self) -> QuerySet[Promise]:
        if getattr(self, "swagger_fake_view", False):
            return Promise.objects.none()
        return of_tenant(Promise, self.tenant)

    def _promise(self, promise_id: str) -> Promise:
        found = self.get_queryset().filter(id=promise_id).first()
        if found is None:
            raise services.NotFound(f"no promise {promise_id}", "promise_id")
        return found

    @extend_schema(summary="A promise")
    def retrieve(self, request: Request, promise_id: str) -> Response:
        return Response(s.PromiseSerializer(self._promise(promise_id)).data)

    @extend_schema(
        summary="Resolve with a value",
        request=s.ResolvePromiseSerializer,
        responses=s.PromiseSerializer,
    )
    @_errors(409, 413)
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, promise_id: str) -> Response:
        body = self.validated(s.ResolvePromiseSerializer)
        services.settle_promise(self.tenant, promise_id, value=s.json_text(body["value"]))
        return Response(s.PromiseSerializer(self._promise(promise_id)).data)

    @extend_schema(
        summary="Reject with a message",
        request=s.RejectPromiseSerializer,
        responses=s.PromiseSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, promise_id: str) -> Response:
        body = self.validated(s.RejectPromiseSerializer)
        services.settle_promise(self.tenant, promise_id, error=body["message"], reject=True)
        return Response(s.PromiseSerializer(self._promise(promise_id)).data)


# --- retention -----------------------------------------------------------------------------------


@extend_schema(tags=["retention"])
class RetentionViewSet(TenantViewSet):
    """The tenant's retention policy and its definitions' overrides (docs/operations.md,
    "Data lifetime")."""

    action_roles = {"update": Role.ADMIN}

    @extend_schema(summary="The retention policy", responses=s.RetentionSerializer)
    def retrieve(self, request: Request) -> Response:
        return Response(retention.describe(self.tenant))

    @extend_schema(
        summary="Replace the retention policy",
        description=(
            "Replaces the tenant's policy and its definitions' overrides: a field left out "
            "or null inherits (the tenant's from the CLEAT_RETAIN_* settings, a definition's "
            "from the tenant's), a definition left out has no override. Writes an audit row."
        ),
        request=s.RetentionUpdateSerializer,
        responses=s.RetentionSerializer,
    )
    def update(self, request: Request) -> Response:
        self.validated(s.RetentionUpdateSerializer)  # unknown fields, shape
        return Response(retention.replace_policies(self.tenant, request.data, self.operator))


# --- workers -------------------------------------------------------------------------------------


@extend_schema(tags=["operations"])
class WorkerViewSet(TenantViewSet):
    """The fleet's workers, as each last reported itself (docs/operations.md, "Workers").
    Fleet infrastructure, the same for every tenant's keys: host, process, queues and counts,
    never a run or a tenant. Needs the operator role."""

    serializer_class = s.WorkerSerializer
    pagination_class = WorkerPagination
    action_roles = {"list": Role.OPERATOR}

    def get_queryset(self) -> QuerySet[WorkerProcess]:
        return WorkerProcess.objects.all()

    @extend_schema(
        summary="List workers",
        parameters=[s.WorkerFilterSerializer],
        responses=s.WorkerSerializer(many=True),
    )
    def list(self, request: Request) -> Response:
        query = self.params(s.WorkerFilterSerializer)
        now = fleet_now()
        workers = self.get_queryset()
        if query.get("stale") is not None:
            stale = {w.worker_id for w in workers if w.is_stale(now)}
            workers = (
                workers.filter(worker_id__in=stale)
                if query["stale"]
                else workers.exclude(worker_id__in=stale)
            )
        page = self.paginate_queryset(workers)
        data = s.WorkerSerializer(page, many=True, context={"now": now}).data
        return self.get_paginated_response(data)
