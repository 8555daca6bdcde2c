"""Redaction of sensitive values in JSON payloads read back out of the engine.

The rules are the reference's (``Redact``): a field whose *name* contains one of the
sensitive substrings (``token``, ``secret``, ``password``, ``credential``, ``api_key``,
``authorization``, ...; case-insensitive) has its value replaced with ``"[REDACTED]"``, and a
string that contains something shaped like a JSON Web Token is replaced whatever its field is
called. Objects and arrays are walked recursively.

Redaction is applied on *read* (API responses): histories may hold data written before a
pattern was added, so redacting at write time alone would leave old secrets readable. The
stored history itself is never rewritten -- replay needs the recorded answers verbatim.

Field names are compared after lower-casing and dropping ``_``, ``-`` and spaces, so
``api_key``, ``apiKey``, ``Api-Key`` and ``X-API-KEY`` all match the pattern ``api_key``.
Payloads often carry JSON *inside* strings (a durable call's request is JSON text inside the
event's JSON); such strings are parsed, redacted and re-serialised too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"

BUILTIN_PATTERNS: tuple[str, ...] = (
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "api_key",
    "apikey",
    "authorization",
    "private_key",
    "access_key",
    "cookie",
)

# header.payload.signature, each base64url; the header of a JWT always starts with '{"'
# which base64url-encodes to "eyJ".
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")
# Nested JSON is only re-parsed up to this size and depth (a read path must stay cheap).
_MAX_NESTED_TEXT = 1024 * 1024
_MAX_DEPTH = 64


def _normalise(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.lower())


class RedactionError(ValueError):
    """A pattern file cannot be read."""


class Redactor:
    """Redacts values by field name and JWT shape. Immutable once built."""

    def __init__(self, patterns: Iterable[str] = BUILTIN_PATTERNS) -> None:
        normalised = {_normalise(p) for p in patterns}
        self.patterns: frozenset[str] = frozenset(p for p in normalised if p)

    @classmethod
    def with_pattern_file(cls, path: str | Path | None) -> Redactor:
        """The built-in patterns plus those of ``path`` (one substring per line; blank lines
        and lines starting with ``#`` are ignored), like the reference's LoadRedactPatterns."""
        if not path:
            return cls()
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RedactionError(f"cannot read redaction patterns from {path}: {exc}") from None
        extra = [
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        return cls((*BUILTIN_PATTERNS, *extra))

    def is_sensitive(self, field: str) -> bool:
        name = _normalise(field)
        return any(pattern in name for pattern in self.patterns)

    def value(self, value: Any, _depth: int = 0) -> Any:
        """A redacted copy of a parsed JSON value (the input is not modified)."""
        if _depth > _MAX_DEPTH:
            return value
        if isinstance(value, dict):
            return {
                key: REDACTED
                if isinstance(key, str) and self.is_sensitive(key) and item is not None
                else self.value(item, _depth + 1)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self.value(item, _depth + 1) for item in value]
        if isinstance(value, str):
            return self.string(value, _depth)
        return value

    def string(self, text: str, _depth: int = 0) -> str:
        """A string value: JWT-looking content is redacted; JSON text inside it is walked."""
        stripped = text.lstrip()
        if stripped[:1] in ("{", "[") and len(text) <= _MAX_NESTED_TEXT:
            try:
                parsed = json.loads(text)
            except ValueError:
                pass
            else:
                redacted = self.value(parsed, _depth + 1)
                if redacted == parsed:
                    return text
                return json.dumps(redacted, separators=(",", ":"), ensure_ascii=False)
        if _JWT.search(text):
            return REDACTED
        return text

    def json_text(self, raw: str) -> str:
        """A JSON document given as text, redacted (``Redact``). Text that is not JSON is
        returned as it is, except that JWT-looking content is still redacted."""
        try:
            parsed = json.loads(raw)
        except ValueError:
            return REDACTED if _JWT.search(raw) else raw
        redacted = self.value(parsed)
        if redacted == parsed:
            return raw
        return json.dumps(redacted, separators=(",", ":"), ensure_ascii=False)


__all__ = ["BUILTIN_PATTERNS", "REDACTED", "RedactionError", "Redactor"]
