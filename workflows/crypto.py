"""Encryption at rest: the envelope of every payload a workflow or its callers supply, and
the one rule that seals and opens it.

With ``CLEAT_ENCRYPTION_KEYS`` set (a JSON object: key id -> base64 of 32 random bytes) and
``CLEAT_ENCRYPTION_KEY_ID`` naming the current key (optional with one key), each payload
column is written as text::

    cleat:enc:v1:<key id>:<base64url(nonce ‖ AES-256-GCM ciphertext ‖ tag)>

The associated data binds the ciphertext to the key id, the tenant, the row it belongs to
(its run, or what owns it) and the column (``workflows.workflowevent.payload``): a
ciphertext copied into another row, another tenant or another column does not open.

Why a text envelope and not a binary column or a key-id column: every payload column is
text (or JSON) on every dialect, so encrypted and plaintext rows live side by side in the
same column -- rows written before encryption was turned on stay readable, and a rotation
can run online over a table that holds both. The key id is in the envelope's prefix, so
``rotate_keys --check`` counts the rows a key protects with one prefix ``LIKE`` per column and
key, and no column changes (migration 0016 only adds the error code).

Why the rule sits on the model and not in a custom field alone: a field's ``from_db_value``
sees the value but not its row, so it could not check the binding to the row; the model's
``from_db`` sees the whole row, and a field's ``pre_save`` sees the instance being written.

Where the rule is applied (and nowhere else is the envelope built or parsed):

* models' :class:`SealedTextField` / :class:`SealedJSONField` seal on every ORM write
  (``save``, ``create``, ``bulk_create``) from the row's own tenant and owner fields, and
  :class:`SealedModel.from_db` opens every row the ORM loads, so model instances always hold
  plaintext;
* the few paths that bypass the model (``values_list`` reads, ``update()`` writes, the
  PostgreSQL one-message SQL) call :func:`seal_column` / :func:`open_column` with the same
  context. A new ``update()`` or ``values_list`` of a sealed column must do the same:
  ``tests/integration/test_encryption.py`` reads every sealed column raw and fails on one
  written in plaintext.

A row that cannot be opened (its key is not configured, or the ciphertext was altered or
moved) raises :class:`EncryptionKeyMissing` on the explicit paths; a model instance keeps
the ciphertext as :class:`Unopened` (written back unchanged on save, shown as a placeholder
by the API and the admin), so loading a run to fail it never needs the missing key. The
executor fails such a run with the code ``encryption_key_missing`` and the key id.

Event checksums are computed over the plaintext payload (``engine.events``), so
``verify`` and exported histories do not depend on the key.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import models

PREFIX = "cleat:enc:v1:"
NONCE_BYTES = 12
KEY_BYTES = 32


class EncryptionKeyMissing(Exception):
    """A stored payload cannot be opened: its key is not configured, or it does not
    authenticate under it (a wrong key, an altered or moved ciphertext)."""

    def __init__(self, key_id: str, message: str) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.message = message


class Unopened(str):
    """A ciphertext a model instance could not open, kept as stored (see the module doc)."""

    error: EncryptionKeyMissing


@dataclass(frozen=True)
class Keyring:
    keys: dict[str, AESGCM]
    current: str


def parse_keyring(keys_setting: Any, current_setting: Any) -> Keyring | None:
    """The keyring the two settings describe, None when encryption is off. Raises
    ImproperlyConfigured naming what is wrong (bad JSON, bad base64, a key not 32 bytes, a
    current key id that is not among the keys)."""
    if keys_setting in (None, "", {}):
        if current_setting:
            raise ImproperlyConfigured(
                f"CLEAT_ENCRYPTION_KEY_ID is {current_setting!r} but CLEAT_ENCRYPTION_KEYS is empty"
            )
        return None
    raw = keys_setting
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"CLEAT_ENCRYPTION_KEYS is not JSON ({exc})") from None
    if not isinstance(raw, dict) or not raw:
        raise ImproperlyConfigured(
            "CLEAT_ENCRYPTION_KEYS must be a JSON object mapping key ids to base64 keys"
        )
    keys: dict[str, AESGCM] = {}
    for key_id, encoded in raw.items():
        if not isinstance(key_id, str) or not key_id or ":" in key_id:
            raise ImproperlyConfigured(
                f"CLEAT_ENCRYPTION_KEYS: key id {key_id!r} must be non-empty text without ':'"
            )
        try:
            secret = base64.b64decode(str(encoded), validate=True)
        except (binascii.Error, ValueError):
            raise ImproperlyConfigured(
                f"CLEAT_ENCRYPTION_KEYS: key {key_id!r} is not valid base64"
            ) from None
        if len(secret) != KEY_BYTES:
            raise ImproperlyConfigured(
                f"CLEAT_ENCRYPTION_KEYS: key {key_id!r} is {len(secret)} bytes, not {KEY_BYTES}"
            )
        keys[key_id] = AESGCM(secret)
    current = str(current_setting or "")
    if not current:
        if len(keys) != 1:
            raise ImproperlyConfigured(
                "CLEAT_ENCRYPTION_KEY_ID must name the current key when there are several "
                f"(known: {', '.join(sorted(keys))})"
            )
        current = next(iter(keys))
    if current not in keys:
        raise ImproperlyConfigured(
            f"CLEAT_ENCRYPTION_KEY_ID {current!r} is not in CLEAT_ENCRYPTION_KEYS "
            f"(known: {', '.join(sorted(keys))})"
        )
    return Keyring(keys, current)


@cache
def keyring() -> Keyring | None:
    """The configured keyring (read once; :func:`reset` after changing the settings)."""
    from django.conf import settings

    keys = getattr(settings, "CLEAT_ENCRYPTION_KEYS", None)
    if isinstance(keys, str) and keys and not keys.lstrip().startswith("{"):
        # A credential provider names the JSON (workflows.secrets): "vault:cleat/keys#keys".
        from workflows import secrets

        try:
            keys = secrets.resolve(keys)
        except secrets.SecretError as exc:
            raise ImproperlyConfigured(f"CLEAT_ENCRYPTION_KEYS: {exc}") from None
    return parse_keyring(keys, getattr(settings, "CLEAT_ENCRYPTION_KEY_ID", ""))


def reset() -> None:
    keyring.cache_clear()


def _setting_changed(setting: str = "", **kwargs: Any) -> None:
    if setting.startswith("CLEAT_ENCRYPTION_"):
        reset()


setting_changed.connect(_setting_changed)


def _part(value: Any) -> str:
    return str(value)


def associated_data(key_id: str, tenant: Any, owner: str, kind: str) -> bytes:
    return "\x00".join(("cleat:v1", key_id, _part(tenant), owner, kind)).encode()


def is_sealed(text: Any) -> bool:
    return isinstance(text, str) and text.startswith(PREFIX)


def key_id_of(text: str) -> str:
    return text[len(PREFIX) :].partition(":")[0]


def seal(text: str | None, *, tenant: Any, owner: str, kind: str) -> str | None:
    """``text`` as stored: its envelope under the current key, or itself when encryption is
    off (and None stays None). A value already sealed (an :class:`Unopened` one) is kept."""
    ring = keyring()
    if ring is None or text is None or is_sealed(text):
        return text
    nonce = os.urandom(NONCE_BYTES)
    sealed = ring.keys[ring.current].encrypt(
        nonce, text.encode(), associated_data(ring.current, tenant, owner, kind)
    )
    return f"{PREFIX}{ring.current}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def open_text(text: str | None, *, tenant: Any, owner: str, kind: str) -> str | None:
    """The plaintext of a stored value (a plaintext row comes back as it is). Raises
    :class:`EncryptionKeyMissing` naming the key id when it cannot be opened."""
    if not is_sealed(text):
        return text
    assert text is not None
    key_id, _, body = text[len(PREFIX) :].partition(":")
    ring = keyring()
    key = ring.keys.get(key_id) if ring is not None else None
    if key is None:
        raise EncryptionKeyMissing(
            key_id, f"encryption key {key_id!r} is not configured (CLEAT_ENCRYPTION_KEYS)"
        )
    try:
        blob = base64.urlsafe_b64decode(body)
        plain = key.decrypt(
            blob[:NONCE_BYTES], blob[NONCE_BYTES:], associated_data(key_id, tenant, owner, kind)
        )
    except (InvalidTag, binascii.Error, ValueError):
        raise EncryptionKeyMissing(
            key_id,
            f"a payload sealed with encryption key {key_id!r} does not open with it "
            "(a wrong key, or an altered or moved ciphertext)",
        ) from None
    return plain.decode()


def seal_json(value: Any, *, tenant: Any, owner: str, kind: str) -> Any:
    """A JSON column's value as stored: the envelope (a JSON string) of its JSON text."""
    if keyring() is None or value is None or is_sealed(value):
        return value
    return seal(json.dumps(value), tenant=tenant, owner=owner, kind=kind)


def open_json(value: Any, *, tenant: Any, owner: str, kind: str) -> Any:
    if not is_sealed(value):
        return value
    return json.loads(open_text(value, tenant=tenant, owner=owner, kind=kind) or "null")


# --- the models' side -----------------------------------------------------------------------


def kind_of(model: type[models.Model], field: str) -> str:
    return f"{model._meta.label_lower}.{field}"


def owner_of(model: type[models.Model], values: Iterable[Any]) -> str:
    """The owner part of the associated data from the values of ``model.SEAL_OWNER``."""
    del model
    return "/".join(_part(v) for v in values)


class _Sealed:
    """What both sealed fields share: sealing in ``pre_save`` from the row being saved."""

    json_column = False

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = super().pre_save(model_instance, add)  # type: ignore[misc]
        if keyring() is None or value is None:
            return value
        name = self.attname  # type: ignore[attr-defined]
        context = row_context(model_instance, name)
        if self.json_column:
            return seal_json(value, **context)
        return seal(value, **context)

    def deconstruct(self) -> Any:
        # The column is what it was (text or JSON): migrations see the plain field.
        name, _path, args, kwargs = super().deconstruct()  # type: ignore[misc]
        base = "JSONField" if self.json_column else "TextField"
        return name, f"django.db.models.{base}", args, kwargs


class SealedTextField(_Sealed, models.TextField):  # type: ignore[misc]
    """A text column whose values are stored sealed when encryption is on."""


class SealedJSONField(_Sealed, models.JSONField):  # type: ignore[misc]
    """A JSON column whose value is stored as the JSON string of its sealed text."""

    json_column = True


def row_context(instance: models.Model, field: str) -> dict[str, Any]:
    model = type(instance)
    owner = owner_of(model, (getattr(instance, a) for a in model.SEAL_OWNER))  # type: ignore[attr-defined]
    return {"tenant": instance.tenant_id, "owner": owner, "kind": kind_of(model, field)}  # type: ignore[attr-defined]


@cache
def sealed_fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], ...]:
    return tuple(f for f in model._meta.concrete_fields if isinstance(f, _Sealed))


class SealedModel(models.Model):
    """A model with sealed columns: ``SEAL_OWNER`` names the attributes (after the tenant)
    that bind a ciphertext to its row; rows the ORM loads are opened here."""

    SEAL_OWNER: tuple[str, ...] = ()

    class Meta:
        abstract = True

    @classmethod
    def from_db(cls, db: Any, field_names: Any, values: Any) -> Any:
        instance = super().from_db(db, field_names, values)
        for field in sealed_fields(cls):
            value = instance.__dict__.get(field.attname)
            if not is_sealed(value):
                continue
            context = row_context(instance, field.attname)
            try:
                if isinstance(field, SealedJSONField):
                    instance.__dict__[field.attname] = open_json(value, **context)
                else:
                    instance.__dict__[field.attname] = open_text(value, **context)
            except EncryptionKeyMissing as exc:
                kept = Unopened(value)
                kept.error = exc
                instance.__dict__[field.attname] = kept
        return instance


def unopened(instance: models.Model) -> EncryptionKeyMissing | None:
    """The first payload of a loaded row that could not be opened, if any."""
    for field in sealed_fields(type(instance)):
        value = instance.__dict__.get(field.attname)
        if isinstance(value, Unopened):
            return value.error
    return None


def shown(value: Any) -> Any:
    """A value for a page or an API answer: an unopened ciphertext becomes a placeholder
    naming its key (never the ciphertext, never an exception)."""
    if isinstance(value, Unopened):
        return f"[encrypted with key {value.error.key_id!r}, which is not available]"
    return value


# --- the paths that bypass the model (values_list reads, update() writes, raw SQL) -----------


def seal_column(
    model: type[models.Model], field: str, tenant: Any, owner: Iterable[Any], text: str | None
) -> str | None:
    """:func:`seal` for ``model.field`` of the row ``owner`` (the values of ``SEAL_OWNER``).
    With encryption off, ``text`` itself, without building the associated data (once for
    every event a run writes)."""
    if keyring() is None:
        return text
    return seal(text, tenant=tenant, owner=owner_of(model, owner), kind=kind_of(model, field))


def open_column(
    model: type[models.Model], field: str, tenant: Any, owner: Iterable[Any], text: str | None
) -> str | None:
    """:func:`open_text` for ``model.field`` of the row ``owner``."""
    if not is_sealed(text):
        return text
    return open_text(text, tenant=tenant, owner=owner_of(model, owner), kind=kind_of(model, field))


def seal_json_column(
    model: type[models.Model], field: str, tenant: Any, owner: Iterable[Any], value: Any
) -> Any:
    """:func:`seal_json` for ``model.field`` of the row ``owner`` (with encryption off,
    ``value`` itself, as :func:`seal_column`)."""
    if keyring() is None:
        return value
    return seal_json(value, tenant=tenant, owner=owner_of(model, owner), kind=kind_of(model, field))


def shown_column(
    model: type[models.Model], field: str, tenant: Any, owner: Iterable[Any], text: str | None
) -> str | None:
    """:func:`open_column` for a page: a value that cannot be opened becomes the placeholder
    :func:`shown` gives (pages and answers never raise over a missing key)."""
    try:
        return open_column(model, field, tenant, owner, text)
    except EncryptionKeyMissing as exc:
        kept = Unopened(text or "")
        kept.error = exc
        return str(shown(kept))
