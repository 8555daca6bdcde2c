"""Template filters of the operator console: ``{{ text|redacted }}`` shows stored text (an
error, a reason, a payload) the way the REST API does, with sensitive values replaced."""

from __future__ import annotations

from typing import Any

from django import template

from workflows.redaction import redacted_text

register = template.Library()


@register.filter
def redacted(value: Any) -> str:
    return "" if value is None else redacted_text(str(value))
