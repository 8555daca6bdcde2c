"""Template filters of the operator console: ``{{ text|redacted }}`` shows stored text (an
error, a reason, a payload) the way the REST API does, with sensitive values replaced."""

from __future__ import annotations

from typing import Any

from django import template

from workflows.console import display
from workflows.redaction import redacted_text

register = template.Library()


@register.filter
def redacted(value: Any) -> str:
    return "" if value is None else redacted_text(str(value))


@register.filter
def status_label(value: Any) -> str:
    """``dead_lettered`` -> ``dead-lettered``: one spelling of a status on every page."""
    return display.status_label(str(value))


@register.filter
def run_status(instance: Any) -> str:
    """The status a page shows for a run (``waiting`` for a ready run not yet due)."""
    return display.instance_status(instance)


@register.filter
def size_text(value: Any) -> str:
    return display.size_text(value if isinstance(value, int) else None)


@register.filter
def cut_error_type(value: Any) -> str:
    """The exception's name of a stored error ("RuntimeError: ..." -> "RuntimeError"): what
    a tenant's staff may see of a fleet worker's error, whose text can quote another
    tenant's values."""
    head = str(value or "").split(":", 1)[0].strip()
    return head if head.isidentifier() else "error"
