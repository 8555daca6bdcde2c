"""Replay-stable identity, randomness and idempotency keys.

Everything here is a pure function of values that are identical on the first execution
and on every replay (workflow id, run id, step, seed), which is what makes it replay-safe.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Callable


def idempotency_key(workflow_id: str, run_id: str, step: int) -> str:
    """The key of one durable call: ``base32(sha256(wf ‖ 0x00 ‖ run ‖ 0x00 ‖ step))``.

    Lower case, no padding, step in decimal. The NUL separators keep the encoding
    injective: without them workflow "ab" run "c" and workflow "a" run "bc" would collide.
    """
    digest = hashlib.sha256(
        workflow_id.encode() + b"\x00" + run_id.encode() + b"\x00" + str(step).encode()
    ).digest()
    return b32_lower(digest)


class IdempotencyKeys:
    """``idempotency_key(workflow_id, run_id, step)`` of one run, as ``keys(step)``: the
    common prefix ``wf ‖ 0x00 ‖ run ‖ 0x00`` is hashed once and the hash state copied for
    each step (a durable call asks for one key per step)."""

    __slots__ = ("_prefix",)

    def __init__(self, workflow_id: str, run_id: str) -> None:
        self._prefix = hashlib.sha256(workflow_id.encode() + b"\x00" + run_id.encode() + b"\x00")

    def __call__(self, step: int) -> str:
        state = self._prefix.copy()
        state.update(str(step).encode())
        return b32_lower(state.digest())


# --- base32 --------------------------------------------------------------------------------
# ``base64.b32encode`` is pure Python in 3.11 (a loop over 5-byte chunks, about 3.5 µs for a
# SHA-256 digest). ``b32_lower`` gives the same text (RFC 4648 alphabet, lower case, padding
# removed) with a fixed number of big-integer operations: the input, read as one integer,
# has its 5-bit groups spread apart into one byte each (six halvings, for up to 64 groups),
# and ``bytes.translate`` maps each byte 0-31 to its letter.

_B32_ALPHABET = b"abcdefghijklmnopqrstuvwxyz234567"
_B32_TABLE = bytes.maketrans(bytes(range(32)), _B32_ALPHABET)
_B32_LANES = 64  # 5-bit groups the spreading handles: inputs of up to 40 bytes
_B32_FAST_MAX_BYTES = _B32_LANES * 5 // 8


def _b32_spread_steps() -> tuple[tuple[int, int, int], ...]:
    """``(keep, move, shift)`` for each halving: ``x = (x & keep) | ((x & move) << shift)``.

    Before a halving the number is made of lanes of ``width`` bits, each holding ``groups``
    5-bit groups packed at its low end; afterwards, lanes of half the width each hold half
    the groups, so after the last one every group sits alone at the bottom of its byte."""
    steps: list[tuple[int, int, int]] = []
    groups, width = _B32_LANES, 8 * _B32_LANES
    while groups > 1:
        half_bits = 5 * (groups // 2)
        low = (1 << half_bits) - 1
        keep = move = 0
        for base in range(0, 8 * _B32_LANES, width):
            keep |= low << base
            move |= low << (base + half_bits)
        steps.append((keep, move, width // 2 - half_bits))
        groups, width = groups // 2, width // 2
    return tuple(steps)


def _make_b32_lower() -> Callable[[bytes], str]:
    # The masks and shifts live in closure cells, which read as fast as locals.
    (k0, m0, s0), (k1, m1, s1), (k2, m2, s2), (k3, m3, s3), (k4, m4, s4), (k5, m5, s5) = (
        _b32_spread_steps()
    )
    lanes, fast_max, table = _B32_LANES, _B32_FAST_MAX_BYTES, _B32_TABLE
    from_bytes = int.from_bytes

    def b32_lower(data: bytes) -> str:
        """``base64.b32encode(data).decode().rstrip("=").lower()``, several times faster for
        short inputs (digests); inputs over 40 bytes go through ``base64``."""
        size = len(data)
        if size > fast_max:
            return base64.b32encode(data).decode().rstrip("=").lower()
        groups = (size * 8 + 4) // 5
        # The groups at the low end: the last one is padded with zero bits, as in base32.
        x = from_bytes(data, "big") << (groups * 5 - size * 8)
        x = (x & k0) | ((x & m0) << s0)
        x = (x & k1) | ((x & m1) << s1)
        x = (x & k2) | ((x & m2) << s2)
        x = (x & k3) | ((x & m3) << s3)
        x = (x & k4) | ((x & m4) << s4)
        x = (x & k5) | ((x & m5) << s5)
        return x.to_bytes(lanes, "big")[lanes - groups :].translate(table).decode()

    return b32_lower


b32_lower = _make_b32_lower()


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
