"""Compiled modules shared through the database (``engine.module_cache.SharedArtifacts``).

A deploy compiles the version it stores (``WasmRuntime.inspect``), and the module cache then
publishes the serialized artifact here; a worker on another machine, or a new one with an
empty disk cache, reads it instead of compiling: a Python workflow's component (~36 MB of
native code) loads in well under a second instead of compiling for 7 to 12 s.

Artifacts are stored in chunks of ``CHUNK_BYTES`` (under every database's default packet
limit), all in one transaction, with an HMAC-SHA256 of the name and the whole content keyed by
the deployment's ``SECRET_KEY``: wasmtime loads the bytes as native code, so bytes this
deployment did not write are refused (and the module compiled instead). ``CLEAT_SHARE_COMPILED``
(default on) turns it off.
"""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.crypto import salted_hmac

from workflows.models import CompiledArtifact

log = logging.getLogger("cleat.engine")

CHUNK_BYTES = 4 * 1024 * 1024
_SALT = "cleat.compiled-artifact"


def _mac(name: str, data: bytes) -> str:
    return salted_hmac(_SALT, name.encode() + b"\0" + data, algorithm="sha256").hexdigest()


class DatabaseArtifacts:
    """The shared artifacts in the ``workflows_compiledartifact`` table."""

    def fetch(self, name: str) -> bytes | None:
        with transaction.atomic():  # a failed read must not break the caller's transaction
            rows = list(
                CompiledArtifact.objects.filter(name=name)
                .order_by("seq")
                .values_list("seq", "chunks", "size", "mac", "data")
            )
        if not rows:
            return None
        chunks, size, mac = rows[0][1], rows[0][2], rows[0][3]
        data = b"".join(bytes(row[4]) for row in rows)
        complete = [row[0] for row in rows] == list(range(chunks)) and len(data) == size
        if not complete or not hmac.compare_digest(mac, _mac(name, data)):
            log.warning(
                "shared artifact %s fails its check (written under another SECRET_KEY, or "
                "changed): compiling instead",
                name,
            )
            return None
        return data

    def publish(self, name: str, data: bytes) -> None:
        mac = _mac(name, data)
        pieces = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        try:
            # One savepoint for the check and the writes: a failure here (the table missing,
            # a lost connection) must not break the caller's transaction (a deploy's).
            with transaction.atomic():
                if CompiledArtifact.objects.filter(name=name, seq=0).exists():
                    return
                for seq, piece in enumerate(pieces):
                    CompiledArtifact.objects.create(
                        name=name, seq=seq, chunks=len(pieces), size=len(data), mac=mac, data=piece
                    )
        except IntegrityError:
            return  # another process shared it a moment ago
        log.info("shared compiled artifact %s (%d bytes, %d chunks)", name, len(data), len(pieces))


def enabled() -> bool:
    return bool(getattr(settings, "CLEAT_SHARE_COMPILED", True))
