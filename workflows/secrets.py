"""Secrets from credential providers: the database password, the encryption keys, HTTP
services' bearer tokens.

A setting that holds a secret may name where to read it instead of holding it:

============================================  =================================================
``env:NAME``                                  the environment variable ``NAME``
``file:/run/secrets/db-password``             a file's content, without its trailing newline
                                              (mounted secrets: Kubernetes, Docker, systemd)
``aws-secretsmanager:SECRET_ID``              AWS Secrets Manager's ``SecretString`` (boto3;
``aws-secretsmanager:SECRET_ID#field``        ``#field`` reads one field of a JSON secret)
``vault:PATH#field``                          HashiCorp Vault's KV v2 engine (hvac): ``field``
                                              of the secret at ``PATH`` (default ``value``)
============================================  =================================================

Anything else is the secret itself. Values are cached for ``CLEAT_SECRETS_TTL_SECONDS``
(default 60), so a rotated secret is picked up without a restart: the database backends
(``cleat_project.db``) read the password at every new connection, and one that the server
refuses is read again at once. A provider that fails while a cached value exists serves the
stale value (with a warning) rather than failing every connection; one that fails with
nothing cached raises :class:`SecretError` naming the provider and the secret, never a value.

Provider settings: ``CLEAT_AWS_REGION`` and ``CLEAT_AWS_ENDPOINT_URL`` (both optional: boto3's
own configuration applies), ``CLEAT_VAULT_ADDR``, ``CLEAT_VAULT_TOKEN`` (itself a secret
setting: ``file:/var/run/vault-token`` or ``env:VAULT_TOKEN``, the default) and
``CLEAT_VAULT_MOUNT`` (default ``secret``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("cleat.secrets")

PROVIDERS = ("env", "file", "aws-secretsmanager", "vault")
DEFAULT_TTL_S = 60.0


class SecretError(Exception):
    """A secret that cannot be read; the message names the provider and the secret."""


@dataclass(frozen=True)
class SecretRef:
    provider: str  # "" for a literal value
    name: str
    field: str = ""

    def describe(self) -> str:
        if not self.provider:
            return "a literal value"
        return f"{self.provider}:{self.name}" + (f"#{self.field}" if self.field else "")


def parse(spec: str) -> SecretRef:
    """What a secret setting names (a provider reference, or a literal value)."""
    provider, colon, rest = spec.partition(":")
    if not colon or provider not in PROVIDERS:
        return SecretRef("", spec)
    if not rest:
        raise SecretError(f"{provider}: names no secret (write {provider}:NAME)")
    name, _, field = rest.partition("#")
    if provider in ("env", "file") and field:
        name = rest  # '#' is part of a variable's value or a path; fields are for JSON secrets
        field = ""
    return SecretRef(provider, name, field)


_cache: dict[str, tuple[str, float]] = {}
_lock = threading.Lock()


def _settings(name: str, default: Any) -> Any:
    try:
        from django.conf import settings

        return getattr(settings, name, default)
    except Exception:  # settings not configured: a standalone use
        return os.environ.get(name, default)


def ttl_s() -> float:
    return float(_settings("CLEAT_SECRETS_TTL_SECONDS", DEFAULT_TTL_S))


def resolve(spec: str, *, ttl: float | None = None) -> str:
    """The secret ``spec`` names, from the cache while it is younger than ``ttl``."""
    ref = parse(spec)
    if not ref.provider:
        return spec
    ttl = ttl_s() if ttl is None else ttl
    now = time.monotonic()
    with _lock:
        cached = _cache.get(spec)
    if cached is not None and now - cached[1] < ttl:
        return cached[0]
    try:
        value = read(ref)
    except SecretError as exc:
        if cached is None:
            raise
        log.warning("%s; using the value read before for another %.0f s", exc, ttl)
        with _lock:  # asked again after another time to live, not at every use
            _cache[spec] = (cached[0], now)
        return cached[0]
    with _lock:
        _cache[spec] = (value, now)
    return value


def invalidate(spec: str | None = None) -> None:
    """Forget a cached secret (all of them with None): the next use reads it again."""
    with _lock:
        if spec is None:
            _cache.clear()
        else:
            _cache.pop(spec, None)


def read(ref: SecretRef) -> str:
    """Read ``ref`` from its provider now (no cache)."""
    if ref.provider == "env":
        value = os.environ.get(ref.name)
        if value is None:
            raise SecretError(f"env:{ref.name}: the environment variable is not set")
        return value
    if ref.provider == "file":
        try:
            return Path(ref.name).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise SecretError(f"file:{ref.name}: {exc.strerror or exc}") from None
    if ref.provider == "aws-secretsmanager":
        return _from_json(ref, _aws(ref))
    if ref.provider == "vault":
        return _vault(ref)
    raise SecretError(f"no secret provider {ref.provider!r} (one of {', '.join(PROVIDERS)})")


def _from_json(ref: SecretRef, text: str) -> str:
    if not ref.field:
        return text
    try:
        value = json.loads(text)[ref.field]
    except (ValueError, TypeError):
        raise SecretError(f"{ref.describe()}: the secret is not a JSON object") from None
    except KeyError:
        raise SecretError(f"{ref.describe()}: the secret has no field {ref.field!r}") from None
    return value if isinstance(value, str) else json.dumps(value)


def _aws(ref: SecretRef) -> str:
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise SecretError(f"{ref.describe()}: boto3 is not installed") from None
    try:
        client = boto3.client(
            "secretsmanager",
            region_name=_settings("CLEAT_AWS_REGION", "") or None,
            endpoint_url=_settings("CLEAT_AWS_ENDPOINT_URL", "") or None,
        )
        found = client.get_secret_value(SecretId=ref.name)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise SecretError(f"{ref.describe()}: AWS Secrets Manager answered {code}") from None
    except BotoCoreError as exc:
        raise SecretError(f"{ref.describe()}: {exc}") from None
    value = found.get("SecretString")
    if value is None:
        raise SecretError(f"{ref.describe()}: the secret is binary, not a string")
    return str(value)


def _vault(ref: SecretRef) -> str:
    try:
        import hvac
        import hvac.exceptions
        import requests
    except ImportError:
        raise SecretError(f"{ref.describe()}: hvac is not installed") from None
    address = _settings("CLEAT_VAULT_ADDR", "") or os.environ.get("VAULT_ADDR", "")
    if not address:
        raise SecretError(f"{ref.describe()}: CLEAT_VAULT_ADDR is not set")
    token_spec = _settings("CLEAT_VAULT_TOKEN", "") or "env:VAULT_TOKEN"
    token = resolve(token_spec)
    mount = _settings("CLEAT_VAULT_MOUNT", "") or "secret"
    try:
        client = hvac.Client(url=address, token=token, timeout=10)
        answer = client.secrets.kv.v2.read_secret_version(
            path=ref.name, mount_point=mount, raise_on_deleted_version=True
        )
    except hvac.exceptions.InvalidPath:
        raise SecretError(f"{ref.describe()}: Vault has no secret there") from None
    except hvac.exceptions.Forbidden:
        raise SecretError(f"{ref.describe()}: Vault refused the token") from None
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        raise SecretError(f"{ref.describe()}: {type(exc).__name__}: {exc}") from None
    data = answer.get("data", {}).get("data", {})
    field = ref.field or "value"
    if field not in data:
        raise SecretError(f"{ref.describe()}: the secret has no field {field!r}")
    value = data[field]
    return value if isinstance(value, str) else json.dumps(value)
