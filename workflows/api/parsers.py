"""Request body parsers with size limits: JSON bodies up to ``CLEAT_API_MAX_BODY_BYTES``,
WASM modules (raw ``application/wasm`` or ``application/octet-stream`` bodies, or a multipart
upload) up to ``CLEAT_API_MAX_MODULE_BYTES``. A larger body is refused with 413 before it is
read; invalid JSON is a 400 that says where it broke, and so is JSON that no database could
store (a lone UTF-16 surrogate, ``engine.storable``): a 400 naming the field that holds it."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, JSONParser

from engine.storable import find_surrogate, value_fault
from workflows.api.errors import InvalidRequest, PayloadTooLarge

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_MODULE_BYTES = 64 * 1024 * 1024


def max_body_bytes() -> int:
    return int(getattr(settings, "CLEAT_API_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES))


def max_module_bytes() -> int:
    return int(getattr(settings, "CLEAT_API_MAX_MODULE_BYTES", DEFAULT_MAX_MODULE_BYTES))


def _read(stream: Any, limit: int) -> bytes:
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise PayloadTooLarge(f"The request body is larger than {limit} bytes.")
    return bytes(data)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


class LimitedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = _read(stream, max_body_bytes())
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not UTF-8 ({exc.reason})") from None
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        refuse_unstorable(value)
        return value


def refuse_unstorable(body: Any) -> None:
    """A 400 naming the top-level field when the body holds a lone surrogate anywhere."""
    found = find_surrogate(body)
    if found is None:
        return
    path, _ = found
    field = str(path[0]) if path and isinstance(body, dict) else None
    subject = field or "the body"
    raise InvalidRequest(f"{subject} {value_fault(body, root='')}", "invalid_text", field)


class WasmParser(BaseParser):
    """A raw module body; ``request.data`` is the bytes."""

    media_type = "application/wasm"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return _read(stream, max_module_bytes())


class OctetStreamParser(WasmParser):
    media_type = "application/octet-stream"
