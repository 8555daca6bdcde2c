"""Cursor pagination (stable under inserts, no COUNT): ``?cursor=`` from a previous page's
``next``/``previous`` and ``?limit=`` (1-500; events 1-1000). A cursor that does not decode,
or whose position is not a value of the ordering field, is a 400, never a 500."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

MAX_POSITION_INT = 2**31 - 1


def _datetime(text: str) -> Any:
    try:
        parsed = parse_datetime(text)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError(text)
    return parsed


def _integer(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_POSITION_INT:
        raise ValueError(text)
    return value


def _text(text: str) -> str:
    if "\x00" in text or len(text) > 256:
        raise ValueError(text)
    return text


class StrictCursorPagination(CursorPagination):
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    position_type: Callable[[str], Any] = _text

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": "This cursor is not valid."}) from None
        if cursor is not None and cursor.position is not None:
            try:
                type(self).position_type(cursor.position)
            except (TypeError, ValueError, OverflowError):
                raise ValidationError({"cursor": "This cursor is not valid."}) from None
        return cursor

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError(
                {"limit": f"A whole number from 1 to {self.max_page_size} is required."}
            )
        return size

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size)
        return parameters


class RunPagination(StrictCursorPagination):
    ordering = "-created_at"
    position_type = _datetime


class ChainPagination(StrictCursorPagination):
    ordering = "created_at"
    position_type = _datetime


class EventPagination(StrictCursorPagination):
    ordering = "step"
    page_size = 100
    max_page_size = 1000
    position_type = _integer


class DefinitionPagination(StrictCursorPagination):
    ordering = ("name", "-version")
    position_type = _text


class WorkerPagination(StrictCursorPagination):
    ordering = "worker_id"
    position_type = _text
