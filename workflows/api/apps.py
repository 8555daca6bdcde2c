from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class ApiConfig(AppConfig):
    """The REST API. An app of its own so that its admin (API keys) and its migration (the
    key-lookup definer function on PostgreSQL) are found by Django; it has no models."""

    name = "workflows.api"
    label = "cleat_api"
    verbose_name = "REST API"

    def ready(self) -> None:
        # The OpenAPI extensions (workflows.api.schema) register themselves when that module
        # is imported, which DRF does when the schema is generated (DEFAULT_SCHEMA_CLASS
        # names it): not at start-up, where drf-spectacular's import cost every process --
        # a worker's included -- about 170 ms.
        from workflows.apps import CHECK_TAG

        checks.register(check_redaction_patterns, CHECK_TAG)


def check_redaction_patterns(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A configured ``CLEAT_REDACT_PATTERNS_FILE`` must be readable: fail at start-up, not on
    the first read of a payload."""
    from engine.redaction import RedactionError
    from workflows.redaction import redactor

    try:
        redactor()
    except RedactionError as exc:
        return [checks.Error(str(exc), id="cleat_api.E001", obj="CLEAT_REDACT_PATTERNS_FILE")]
    return []
