"""A recorded run as a document: what ``manage.py export_history`` and the API's
``GET /api/v1/workflows/{id}/history`` write, and what :func:`engine.testing.replay` reads.

The document is JSON, one object::

    {"format": "cleat-history/1", "definition": "order", "version": 3,
     "workflow_id": "...", "run_id": "...", "entry_point": "run", "input": "{...}",
     "start_ms": 1767225600000, "min_version": 0,
     "status": "done", "result": "{...}", "error": null, "error_code": null,
     "history": [{"step": 0, "type_code": 1, "ts": ..., "payload": "...",
                  "checksum": "...", "type": "call"}, ...]}

``input`` and ``result`` are JSON texts, as storage holds them; ``history`` holds the events
exactly as stored (``engine.events.history_to_json``: the checksums still verify), with
``type``, the event type's name, for readers. ``start_ms`` is the virtual time before the
first event (the run's creation), which replay needs to give the guest the same clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.events import EncodedEvent, EventType, history_from_json

EXPORT_FORMAT = "cleat-history/1"

_TYPE_NAMES = {t.code: t.value for t in EventType}


class InvalidExport(EngineError):
    """A history document that cannot be read; the message names the field."""


@dataclass(frozen=True)
class RecordedRun:
    """One run's recorded history and what replaying it needs."""

    definition: str
    version: int
    workflow_id: str
    run_id: str
    input: str
    start_ms: int
    history: tuple[EncodedEvent, ...]
    entry_point: str = "run"
    min_version: int = 0
    status: str = ""
    result: str | None = None
    error: str | None = None
    error_code: str | None = None
    # How many of the first events came from the run's compaction checkpoint (the history
    # holds them all, expanded): what a page marks as "steps 0-N compacted".
    compacted_events: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": EXPORT_FORMAT,
            "definition": self.definition,
            "version": self.version,
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "entry_point": self.entry_point,
            "input": self.input,
            "start_ms": self.start_ms,
            "min_version": self.min_version,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "error_code": self.error_code,
            "compacted_events": self.compacted_events,
            "history": [
                {**event.as_dict(), "type": _TYPE_NAMES.get(event.type_code, "unknown")}
                for event in self.history
            ],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordedRun:
        """Read a document (:data:`EXPORT_FORMAT`); :class:`InvalidExport` names what is
        wrong with one that is not."""
        if not isinstance(data, Mapping):
            raise InvalidExport("a history document is a JSON object")
        if data.get("format") != EXPORT_FORMAT:
            raise InvalidExport(
                f"format: expected {EXPORT_FORMAT!r}, got {data.get('format')!r} "
                "(export the run with manage.py export_history)"
            )
        rows = data.get("history")
        if not isinstance(rows, Sequence) or isinstance(rows, str):
            raise InvalidExport("history: expected a list of events")
        try:
            history = tuple(history_from_json(rows))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidExport(f"history: an event cannot be read ({exc})") from None
        return cls(
            definition=_text(data, "definition"),
            version=_number(data, "version"),
            workflow_id=_text(data, "workflow_id"),
            run_id=_text(data, "run_id"),
            input=_text(data, "input"),
            start_ms=_number(data, "start_ms"),
            history=history,
            entry_point=_text(data, "entry_point", "run"),
            min_version=_number(data, "min_version", 0),
            status=_text(data, "status", ""),
            result=_optional_text(data, "result"),
            error=_optional_text(data, "error"),
            error_code=_optional_text(data, "error_code"),
            compacted_events=_number(data, "compacted_events", 0),
        )

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any] | RecordedRun) -> RecordedRun:
        """A recorded run from a document, its JSON text, or the path of a file holding it."""
        if isinstance(source, RecordedRun):
            return source
        if isinstance(source, Mapping):
            return cls.from_json(source)
        text = str(source)
        if isinstance(source, Path) or not text.lstrip().startswith("{"):
            try:
                text = Path(source).read_text(encoding="utf-8")
            except OSError as exc:
                raise InvalidExport(f"cannot read {source}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidExport(f"not JSON: {exc.msg} (line {exc.lineno})") from None
        return cls.from_json(data)


def _text(data: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise InvalidExport(f"{key}: expected a string")
    return value


def _optional_text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidExport(f"{key}: expected a string or null")
    return value


def _number(data: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidExport(f"{key}: expected an integer")
    return value
