"""Key rotation: re-seal every stored payload under the current key (``manage.py
rotate_keys``), and count the rows each key still protects (``rotate_keys --check``).

Every model with sealed columns (``crypto.SealedModel``: the workflow tables and any app's,
the schedules' included -- found through the app registry, so this module imports no app
above it) is walked tenant by tenant (inside the tenant's context, so it works as the
application role under PostgreSQL's row-level security), column by column, in primary-key
order, in transactions of at most :data:`BATCH` rows. A row is re-sealed when its value is
not sealed under the current key: sealed under an older key, or plaintext written before
encryption was turned on.

Online and safe beside workers: each row is written with a compare-and-set on the value it
was read with (``UPDATE ... WHERE pk = %s AND value = <old>``), so a worker's write that
landed meanwhile wins and the rotation leaves that row alone (the worker sealed it under the
current key anyway). Resumable: a rotation that stops (killed, a crash) has committed its
earlier batches; running it again finds only the rows still not under the current key.

A row whose value does not open (its key is not configured) is skipped and counted; the
command then exits non-zero naming the key, and ``--check`` keeps counting those rows under
their key, so that key cannot be retired by mistake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast

from engine.faults import crash_point
from workflows import crypto
from workflows.models import Tenant
from workflows.tenancy import tenant_context

BATCH = 1000
PLAINTEXT = "(plaintext)"

Progress = Callable[[str], None]


def sealed_columns() -> Iterator[tuple[type[models.Model], models.Field[Any, Any]]]:
    """Every sealed column of every installed model, in a stable order."""
    for model in sorted(apps.get_models(), key=lambda m: m._meta.label_lower):
        if issubclass(model, crypto.SealedModel):
            for column in crypto.sealed_fields(model):
                yield model, column


def _is_json(column: models.Field[Any, Any]) -> bool:
    return isinstance(column, crypto.SealedJSONField)


def _text_of(model: type[models.Model], column: models.Field[Any, Any]) -> tuple[Any, str]:
    """The queryset of ``model`` with the column as text (``_text``), and the prefix of a
    sealed value in that text (a JSON column holds the envelope as a JSON string)."""
    rows = model._default_manager.annotate(_text=Cast(column.attname, TextField()))
    return rows, ('"' if _is_json(column) else "") + crypto.PREFIX


def require_keyring() -> crypto.Keyring:
    """The keyring, or ImproperlyConfigured saying why there is none to rotate to."""
    ring = crypto.keyring()
    if ring is None:
        raise ImproperlyConfigured(
            "CLEAT_ENCRYPTION_KEYS is empty: there is no current key to rotate to"
        )
    return ring


@dataclass
class RotationReport:
    resealed: Counter[str] = field(default_factory=Counter)  # by model.column
    unopened: Counter[str] = field(default_factory=Counter)  # by key id
    batches: int = 0


def rotate(
    *, tenant: Tenant | None = None, batch: int = BATCH, progress: Progress | None = None
) -> RotationReport:
    """Re-seal every payload not sealed under the current key (see the module doc)."""
    ring = require_keyring()
    if not 1 <= batch <= BATCH:
        raise ValueError(f"batch must be 1-{BATCH}, not {batch}")
    say = progress or (lambda line: None)
    report = RotationReport()
    tenants = [tenant] if tenant is not None else list(Tenant.objects.order_by("name"))
    for one in tenants:
        for model, column in sealed_columns():
            _rotate_column(one, model, column, ring, batch, report, say)
    return report


def _rotate_column(
    tenant: Tenant,
    model: type[models.Model],
    column: models.Field[Any, Any],
    ring: crypto.Keyring,
    batch: int,
    report: RotationReport,
    say: Progress,
) -> None:
    name = f"{model._meta.label_lower}.{column.attname}"
    owner = tuple(model.SEAL_OWNER)  # type: ignore[attr-defined]
    pk = model._meta.pk.attname  # type: ignore[union-attr]
    last: Any = None
    while True:
        with tenant_context(tenant.id), transaction.atomic():
            rows, prefix = _text_of(model, column)
            todo = rows.filter(tenant_id=tenant.id, _text__isnull=False).exclude(
                _text__startswith=f"{prefix}{ring.current}:"
            )
            if last is not None:
                todo = todo.filter(**{f"{pk}__gt": last})
            found = list(todo.order_by(pk).values_list(pk, *owner, column.attname, "_text")[:batch])
            if not found:
                return
            done = 0
            for row in found:
                key, owners, value, text = row[0], row[1:-2], row[-2], row[-1]
                last = key
                try:
                    plain = _opened(model, column, tenant.id, owners, value)
                except crypto.EncryptionKeyMissing as exc:
                    report.unopened[exc.key_id] += 1
                    continue
                if _is_json(column):
                    new: Any = crypto.seal_json_column(
                        model, column.attname, tenant.id, owners, plain
                    )
                else:
                    new = crypto.seal_column(model, column.attname, tenant.id, owners, plain)
                # Compare-and-set on the value as read: a concurrent write wins.
                done += (
                    _text_of(model, column)[0]
                    .filter(**{pk: key}, _text=text)
                    .update(**{column.attname: new})
                )
            # A crash here (the fault suite) loses this batch's uncommitted work only.
            crash_point("rotate_batch")
        report.batches += 1
        report.resealed[name] += done
        say(
            f"tenant {tenant.name}: {name}: re-sealed {done} of {len(found)} rows "
            f"under key {ring.current!r}"
        )


def _opened(
    model: type[models.Model],
    column: models.Field[Any, Any],
    tenant: Any,
    owners: tuple[Any, ...],
    value: Any,
) -> Any:
    """The plaintext value of a column as ``values_list`` gave it (a JSON column: parsed)."""
    if _is_json(column):
        if not crypto.is_sealed(value):
            return value
        context = {
            "tenant": tenant,
            "owner": crypto.owner_of(model, owners),
            "kind": crypto.kind_of(model, column.attname),
        }
        return crypto.open_json(value, **context)
    return crypto.open_column(model, column.attname, tenant, owners, value)


def check(*, tenant: Tenant | None = None) -> dict[str, Counter[str]]:
    """How many rows each key protects, by column: ``{key id or "(plaintext)": {column: n}}``;
    rows under a key that is not configured are counted under ``"(other keys)"``."""
    ring = require_keyring()
    counts: dict[str, Counter[str]] = {}
    tenants = [tenant] if tenant is not None else list(Tenant.objects.order_by("name"))
    for one in tenants:
        with tenant_context(one.id):
            for model, column in sealed_columns():
                name = f"{model._meta.label_lower}.{column.attname}"
                rows, prefix = _text_of(model, column)
                rows = rows.filter(tenant_id=one.id, _text__isnull=False)
                sealed = rows.filter(_text__startswith=prefix).count()
                known = 0
                for key_id in sorted(ring.keys):
                    n = rows.filter(_text__startswith=f"{prefix}{key_id}:").count()
                    known += n
                    counts.setdefault(key_id, Counter())[name] += n
                counts.setdefault("(other keys)", Counter())[name] += sealed - known
                plain = rows.filter(~Q(_text__startswith=prefix)).count()
                counts.setdefault(PLAINTEXT, Counter())[name] += plain
    return counts
