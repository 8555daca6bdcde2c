"""The redactor every read surface uses: the REST API's serializers and the operator
console alike (``engine.redaction`` holds the rules; ``CLEAT_REDACT_PATTERNS_FILE`` adds
field names). A surface that showed a value the other hides would make redaction pointless,
so both take it from here. Values arrive opened (workflows/crypto.py); one whose key is
missing is shown as a placeholder naming the key (``crypto.shown``), never as ciphertext."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from django.conf import settings

from engine.redaction import REDACTED, Redactor
from engine.storable import readable
from workflows.crypto import Unopened, shown

__all__ = [
    "REDACTED",
    "embedded_json",
    "readable_payload",
    "redacted_payload",
    "redacted_query_state",
    "redacted_text",
    "redacted_value",
    "redactor",
]


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
    if isinstance(text, Unopened):
        return str(shown(text))
    return str(readable(redactor().json_text(str(text))))


def redacted_value(value: Any) -> Any:
    """A parsed JSON value (a JSON column, a query state) with sensitive values replaced.

    Every read surface shows stored data through here, so this is also where a lone
    surrogate stored before the storable-text rule becomes U+FFFD (``engine.storable``):
    a page can always be encoded."""
    if isinstance(value, Unopened):
        return shown(value)
    return readable(redactor().value(value))


def redacted_query_state(query_state: Any) -> dict[str, Any]:
    """A run's query state (key -> JSON text) parsed, with sensitive values replaced."""
    if isinstance(query_state, Unopened):
        return {"": shown(query_state)}
    if not isinstance(query_state, dict):
        return {}
    parsed: dict[str, Any] = {}
    for key, value in query_state.items():
        try:
            parsed[key] = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            parsed[key] = value
    return dict(redacted_value(parsed))


# A text field of an event that holds a JSON document (a call's request and response, a
# signal's payload, a child's input...) starts like one; names, ids and messages do not.
_JSON_STARTS = ("{", "[", '"')


def embedded_json(value: Any) -> Any:
    """``value`` with each string that holds a JSON object, array or string replaced by the
    value it holds, so a display shows ``"req": {"sku": "book"}`` rather than
    ``"req": "{\\"sku\\": \\"book\\"}"``. Other strings stay as they are."""
    if isinstance(value, str):
        if value[:1] in _JSON_STARTS:
            try:
                return json.loads(value)
            except (ValueError, RecursionError):
                return value
        return value
    if isinstance(value, dict):
        return {key: embedded_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [embedded_json(item) for item in value]
    return value


def redacted_payload(text: str | None) -> Any:
    """An event's stored payload (compact JSON, its text fields often JSON themselves) as
    one JSON value with the JSON inside its fields parsed, sensitive values replaced. A
    payload that is not JSON comes back as its redacted text."""
    if not text:
        return {}
    if isinstance(text, Unopened):
        return shown(text)
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return redacted_text(text)
    if not isinstance(parsed, dict):
        return redacted_value(embedded_json(parsed))
    return redacted_value({key: embedded_json(item) for key, item in parsed.items()})


def readable_payload(text: str | None) -> str:
    """:func:`redacted_payload` written as compact JSON text, for a page."""
    value = redacted_payload(text)
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
