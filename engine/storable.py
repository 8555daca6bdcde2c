"""The one rule for text that is stored: no lone UTF-16 surrogate, and no raw U+0000.

JSON may spell a surrogate code point as an escape (``"\\ud800"``) without its partner; Python
parses that into a ``str`` no UTF-8 encoder accepts, so a value holding one cannot be written
to SQLite, PostgreSQL or MariaDB, nor rendered in a UTF-8 response. Every boundary where text
enters (the REST API, the management commands, the admin's forms, the guest's result, query
state and the JSON it hands the host to store) refuses such a value with
:func:`json_text_fault` / :func:`value_fault`; the read paths pass what they parse through
:func:`readable` so that a row stored before the rule (or by any other way in) is shown with
U+FFFD in place of the surrogate rather than failing the whole page.

U+0000 is the other character no backend takes alike: PostgreSQL refuses it in a text
column and as a ``\\u0000`` escape in jsonb, where SQLite and MariaDB store it. Spelled as an
escape inside JSON text (``"\\u0000"``, what ``json.dumps`` writes) it is only six ASCII
characters in a text column, so JSON values may hold it; the raw character in stored text
(a guest's result that is not JSON, a key, a name) is refused like a surrogate.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A surrogate code point in a str (from a JSON escape, or from surrogateescape decoding).
_SURROGATE = re.compile("[\ud800-\udfff]")
# What stored text may not hold itself: a surrogate or a raw U+0000.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Its JSON escape, upper or lower case hex; may be half of a valid pair or follow an escaped
# backslash, so a match only means "parse and look".
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")

REPLACEMENT = "\ufffd"


Path = tuple[str | int, ...]


def find_surrogate(value: Any) -> tuple[Path, bool] | None:
    """Where the first lone surrogate in the parsed JSON ``value`` is: the path of the string
    holding it (keys and list indexes) and whether it is that object's key rather than its
    value; None when there is none. Iterative: a value as deep as the JSON parser allows
    must not exhaust the caller's stack."""
    stack: list[tuple[Path, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return (path, False)
        elif isinstance(item, dict):
            if any(isinstance(key, str) and _SURROGATE.search(key) for key in item):
                return (path, True)
            stack.extend(reversed([((*path, key), inner) for key, inner in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([((*path, i), inner) for i, inner in enumerate(item)]))
    return None


def path_text(path: Path, root: str = "$") -> str:
    """``$.a[0].b`` (or ``a[0].b`` with ``root=""``)."""
    text = root
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def value_fault(value: Any, root: str = "$") -> str | None:
    """Why the parsed JSON ``value`` may not be stored, or None when it may."""
    found = find_surrogate(value)
    if found is None:
        return None
    path, in_key = found
    where = path_text(path, root)
    if in_key:
        inside = f" in a key of {where}" if where else " in a key"
    else:
        inside = f" at {where}" if path else ""
    return f"contains a lone UTF-16 surrogate{inside}, which is not valid Unicode text"


def json_text_fault(text: str) -> str | None:
    """Why the JSON document ``text`` may not be stored, or None when it may.

    Text that is not JSON is not this rule's business (the caller decides what else it
    accepts); a surrogate code point in the text itself is refused either way."""
    fault = text_fault(text)
    if fault is not None:
        return fault
    if not _SURROGATE_ESCAPE.search(text):
        return None  # the common case: no escape that could decode to a surrogate
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value_fault(value)


def text_fault(text: str) -> str | None:
    """Why the plain text ``text`` (a key, a name) may not be stored, or None when it may:
    only its own characters count (a JSON escape in it is just a backslash and letters)."""
    bad = _UNSTORABLE.search(text)
    if bad is None:
        return None
    if bad.group() == "\x00":
        return "contains a NUL character (U+0000), which cannot be stored"
    return "contains a lone UTF-16 surrogate, which is not valid Unicode text"


def readable(value: Any) -> Any:
    """``value`` (parsed JSON or text) with every surrogate replaced by U+FFFD, for display."""
    if isinstance(value, str):
        return _SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [readable(item) for item in value]
    return value


def readable_text(text: str) -> str:
    """``text`` with each surrogate and raw U+0000 replaced by U+FFFD: storable everywhere
    and readable (for a message that is kept whatever it holds, such as a run's error)."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def parse_readable(text: str) -> Any:
    """``json.loads(text)``, made :func:`readable` when the text may hold a surrogate
    (raises ``ValueError`` like ``json.loads`` when it is not JSON, or nested deeper than
    this stack can parse: the caller shows the text instead)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to parse here") from None
    if _SURROGATE_ESCAPE.search(text) or _SURROGATE.search(text):
        try:
            return readable(value)
        except RecursionError:
            return readable(text)  # too deep to rebuild: the text itself, made readable
    return value
