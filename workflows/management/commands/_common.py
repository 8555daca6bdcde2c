"""Shared pieces of the management commands."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections

from engine.storable import json_text_fault
from workflows.models import DEFAULT_TENANT_ID, Tenant
from workflows.services import ServiceError, get_tenant


def add_tenant_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--tenant",
        default=str(DEFAULT_TENANT_ID),
        help="tenant name or id (default: the default tenant)",
    )


def tenant_from(options: dict[str, Any]) -> Tenant:
    try:
        return get_tenant(options["tenant"])
    except ServiceError as exc:
        raise CommandError(exc.message) from None
    except DatabaseError as exc:
        # The first query of most commands: say what to do rather than print a traceback.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CommandError(
            f"the database is not ready ({first}): is DATABASE_URL right, and has "
            "'manage.py migrate' been run?"
        ) from None


def one_of(options: dict[str, Any], positional: str, option: str) -> str | None:
    """A JSON value that may be given as a positional argument or as ``--option``: the one
    given (both is an error rather than a silent choice)."""
    given, named = options.get(positional), options.get(option)
    if given is not None and named is not None:
        raise CommandError(f"give the {option} once: as an argument or with --{option}, not both")
    return given if given is not None else named


def parse_json_option(value: str | None, name: str) -> Any:
    if value is None:
        return None
    try:
        json.loads(value)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--{name} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise CommandError(f"--{name} is nested too deeply to be read") from None
    fault = json_text_fault(value)
    if fault is not None:
        raise CommandError(f"--{name} {fault}")
    # The JSON text itself: the services take a str as a JSON document, so a parsed string
    # value ('"yes"' -> 'yes') would be re-read as (invalid) JSON.
    return value


def fail(exc: ServiceError) -> CommandError:
    where = f" ({exc.field})" if exc.field else ""
    return CommandError(f"{exc.message}{where}")


class VersionOptionMixin:
    """Lets a command define its own ``--version N`` (Django reserves ``--version`` for
    printing Django's version; these commands mean the workflow version)."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("conflict_handler", "resolve")
        return super().create_parser(prog_name, subcommand, **kwargs)  # type: ignore[misc,no-any-return]


def use_worker_connection_age() -> None:
    """Give this process's database connections the worker's lifetime,
    ``CLEAT_WORKER_CONN_MAX_AGE`` (60 s by default), instead of the web's ``CONN_MAX_AGE``
    (0: one connection per request). A worker thread reuses its connection from segment to
    segment; the settings dict is shared with the connections its threads open later."""
    age = int(getattr(settings, "CLEAT_WORKER_CONN_MAX_AGE", 60))
    for alias in connections:
        connections.settings[alias]["CONN_MAX_AGE"] = age
        connections[alias].settings_dict["CONN_MAX_AGE"] = age
    # A connection already open carries the lifetime it was opened with: reopen under the new.
    connections.close_all()
