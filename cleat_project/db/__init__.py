"""Database backends that read the password from a credential provider at every new
connection (``CLEAT_DATABASE_PASSWORD``, ``workflows.secrets``): a rotated password is picked
up without a restart. Settings switch ``DATABASES["default"]["ENGINE"]`` to them when
``CLEAT_DATABASE_PASSWORD`` is set."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("cleat.secrets")


def password_params(params: dict[str, Any], settings_dict: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the password read from the provider the settings name (cached for
    ``CLEAT_SECRETS_TTL_SECONDS``)."""
    spec = settings_dict.get("CLEAT_PASSWORD_SECRET") or ""
    if spec:
        params["password"] = _password(spec)
    return params


def _password(spec: str) -> str:
    """The password ``spec`` names; a provider that cannot give it is a database error (the
    worker and the web treat it as a database they cannot reach: a clear reason at start-up,
    the run given back mid-segment), never a traceback."""
    from django.db import OperationalError

    from workflows import secrets

    try:
        return secrets.resolve(spec)
    except secrets.SecretError as exc:
        raise OperationalError(f"the database password cannot be read: {exc}") from None


def refused_password(exc: BaseException) -> bool:
    """The server refused the credentials (not: it is down)."""
    text = str(exc).lower()
    return "password authentication failed" in text or "access denied for user" in text


def connect_reading_again(
    connect: Any, params: dict[str, Any], settings_dict: dict[str, Any]
) -> Any:
    """``connect(params)``; when the server refuses the password, read it again from the
    provider (it may have been rotated within the cache's lifetime) and try once more."""
    from workflows import secrets

    spec = settings_dict.get("CLEAT_PASSWORD_SECRET") or ""
    try:
        return connect(params)
    except Exception as exc:
        if not spec or not refused_password(exc):
            raise
        secrets.invalidate(spec)
        fresh = _password(spec)
        if fresh == params.get("password"):
            raise
        log.info("database password from %s changed: reconnecting with the new one", spec)
        params["password"] = fresh
        return connect(params)
