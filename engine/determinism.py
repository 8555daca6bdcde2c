"""Replay-stable identity, randomness and idempotency keys.

Everything here is a pure function of values that are identical on the first execution
and on every replay (workflow id, run id, step, seed), which is what makes it replay-safe.
"""

from __future__ import annotations

import base64
import hashlib
import uuid


def idempotency_key(workflow_id: str, run_id: str, step: int) -> str:
    """The key of one durable call: ``base32(sha256(wf ‖ 0x00 ‖ run ‖ 0x00 ‖ step))``.

    Lower case, no padding, step in decimal. The NUL separators keep the encoding
    injective: without them workflow "ab" run "c" and workflow "a" run "bc" would collide.
    """
    digest = hashlib.sha256(
        workflow_id.encode() + b"\x00" + run_id.encode() + b"\x00" + str(step).encode()
    ).digest()
    return base64.b32encode(digest).decode().rstrip("=").lower()


def derived_uuid(*parts: str | int) -> str:
    """A version-4-shaped UUID that is a pure function of ``parts``."""
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def run_seed(workflow_id: str, run_id: str) -> bytes:
    """The seed of a run's random stream (also served to components as wasi:random)."""
    return hashlib.sha256(
        b"cleat-seed\x00" + workflow_id.encode() + b"\x00" + run_id.encode()
    ).digest()


def random_i64(seed: bytes, counter: int) -> int:
    """The ``counter``-th value of the run's random stream, as a signed 64-bit integer."""
    raw = hashlib.blake2b(counter.to_bytes(8, "little"), key=seed[:32], digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def random_bytes(seed: bytes, counter: int, length: int) -> bytes:
    """``length`` bytes of the run's stream at position ``counter`` (for wasi:random)."""
    out = bytearray()
    block = 0
    while len(out) < length:
        out += hashlib.blake2b(
            counter.to_bytes(8, "little") + block.to_bytes(8, "little"), key=seed[:32]
        ).digest()
        block += 1
    return bytes(out[:length])
