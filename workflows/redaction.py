"""The redactor every read surface uses: the REST API's serializers and the operator
console alike (``engine.redaction`` holds the rules; ``CLEAT_REDACT_PATTERNS_FILE`` adds
field names). A surface that showed a value the other hides would make redaction pointless,
so both take it from here."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from django.conf import settings

from engine.redaction import REDACTED, Redactor
from engine.storable import readable

__all__ = ["REDACTED", "redacted_query_state", "redacted_text", "redacted_value", "redactor"]


def redactor() -> Redactor:
    return _redactor_for(str(getattr(settings, "CLEAT_REDACT_PATTERNS_FILE", "") or ""))


@lru_cache(maxsize=4)
def _redactor_for(path: str) -> Redactor:
    return Redactor.with_pattern_file(path or None)


def redacted_text(text: str | None) -> str:
    """Stored text (JSON or not: an input, an event payload, an error) with sensitive values
    replaced; JSON text stays JSON."""
    if text is None:
        return ""
    return str(readable(redactor().json_text(str(text))))


def redacted_value(value: Any) -> Any:
    """A parsed JSON value (a JSON column, a query state) with sensitive values replaced.

    Every read surface shows stored data through here, so this is also where a lone
    surrogate stored before the storable-text rule becomes U+FFFD (``engine.storable``):
    a page can always be encoded."""
    return readable(redactor().value(value))


def redacted_query_state(query_state: Any) -> dict[str, Any]:
    """A run's query state (key -> JSON text) parsed, with sensitive values replaced."""
    if not isinstance(query_state, dict):
        return {}
    parsed: dict[str, Any] = {}
    for key, value in query_state.items():
        try:
            parsed[key] = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            parsed[key] = value
    return dict(redacted_value(parsed))
