"""History compaction: folding a long run's history prefix into one checkpoint.

A run whose history passes a threshold (``CLEAT_COMPACT_AFTER_EVENTS``, 1,000 by default,
0 = off) has its prefix folded into a *checkpoint* stored with the run; loading it reads the
checkpoint plus the remaining event rows. This module is the one rule for both stores: what
to fold (:func:`fold_count`), the checkpoint's format (:class:`CompactionState`, JSON-able),
how it grows (:func:`fold`) and how it is read back (:func:`expand`).

Design note -- what the checkpoint holds, and the approaches dropped:

* The Go reference keeps a "minimal state" of the prefix (sparse events, pending defers,
  open children, query state) and replays from it. A WASM guest cannot be resumed from a
  summary: replay re-executes it from its first instruction, and every host call it makes
  in the prefix must be answered from the recorded event. So the checkpoint keeps every
  compacted event, exactly as encoded (step, type code, timestamp, payload and checksum),
  and everything the reference summarises (defers, children, query state) is derived from
  the expanded history by the same code as before. Expanding gives the rows back
  bit for bit, so ``engine.events.verify`` still checks each event's checksum: a tampered
  checkpoint fails the run with ``history_corrupt`` like a tampered row.
* The reference truncates compacted events past 10,000 into a count ("truncation summary");
  that would drop events replay needs, so there is no such cap here: a checkpoint grows with
  the run (``max_history_length`` and continue-as-new bound it).
* One blob recompressed at every fold costs O(history) per fold; the checkpoint is instead a
  list of *chunks*, each the zlib-compressed JSON of one fold's events, so a fold only
  compresses its own events and appends (the chunk list is small: one per threshold's worth
  of events).
* A tail of :data:`KEEP_TAIL` events (fewer under a threshold below 200:
  :func:`kept_tail`) always stays as rows: the stores' operator paths read
  the last guest step from the rows (a retry forgets the last failed call; its audit events
  follow it), and a write-ahead intent (an event without a checksum, whose outcome is written
  later) must stay a row, so folding stops before the first one.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events import EncodedEvent

FORMAT_VERSION = 1
DEFAULT_THRESHOLD = 1000
# Events kept as rows after a fold (see the module docstring).
KEEP_TAIL = 100


class CompactionCorrupt(ValueError):
    """A stored checkpoint that cannot be read back: not this format, a chunk that does not
    decompress, or events that are not the contiguous prefix it claims to hold."""


@dataclass(frozen=True)
class Chunk:
    first_step: int
    last_step: int
    data: str  # base64 of zlib(JSON list of [step, type_code, ts, payload, checksum])


@dataclass(frozen=True)
class CompactionState:
    """A run's compaction checkpoint: the events of steps ``0 .. through_step`` in chunks."""

    chunks: tuple[Chunk, ...] = ()
    version: int = FORMAT_VERSION

    @property
    def count(self) -> int:
        """How many events the checkpoint holds (they are steps 0 .. count - 1)."""
        return self.chunks[-1].last_step + 1 if self.chunks else 0

    @property
    def through_step(self) -> int:
        """The last compacted step (-1 when nothing is compacted)."""
        return self.count - 1

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "compacted_step": self.through_step,
            "chunks": [[c.first_step, c.last_step, c.data] for c in self.chunks],
        }

    @classmethod
    def from_json(cls, value: Any) -> CompactionState:
        """The state stored as :meth:`as_json` gave it; raises :class:`CompactionCorrupt`."""
        if not isinstance(value, Mapping) or value.get("version") != FORMAT_VERSION:
            raise CompactionCorrupt("the compaction checkpoint is not in format version 1")
        try:
            chunks = tuple(
                Chunk(int(first), int(last), str(data)) for first, last, data in value["chunks"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CompactionCorrupt(
                f"the compaction checkpoint's chunk list is malformed: {exc}"
            ) from None
        expected = 0
        for chunk in chunks:
            if chunk.first_step != expected or chunk.last_step < chunk.first_step:
                raise CompactionCorrupt(
                    f"the compaction checkpoint's chunks are not contiguous at step {expected}"
                )
            expected = chunk.last_step + 1
        if value.get("compacted_step") != expected - 1:
            raise CompactionCorrupt("the compaction checkpoint's compacted_step does not match")
        return cls(chunks)


def fold_count(uncompacted: Sequence[EncodedEvent], threshold: int) -> int:
    """How many of the run's uncompacted events (its rows, in step order) to fold now: none
    until there are ``threshold`` of them (0 = compaction off); then all but the last
    :func:`kept_tail`, stopping before the first write-ahead intent."""
    if threshold <= 0 or len(uncompacted) < threshold:
        return 0
    limit = len(uncompacted) - kept_tail(threshold)
    for position, event in enumerate(uncompacted[:limit]):
        if not event.checksum:
            return position
    return limit


def kept_tail(threshold: int) -> int:
    """How many events a fold leaves as rows: :data:`KEEP_TAIL`, or half the threshold when
    that is smaller (a tiny threshold, as tests set, still folds)."""
    return max(min(KEEP_TAIL, threshold // 2), 1)


def due(uncompacted_count: int, threshold: int) -> bool:
    """Whether a run with this many uncompacted events is worth reading for a fold."""
    return threshold > 0 and uncompacted_count >= threshold


def fold(state: CompactionState | None, events: Sequence[EncodedEvent]) -> CompactionState:
    """``state`` with ``events`` (the steps right after it) appended as one chunk."""
    state = state or CompactionState()
    if not events:
        return state
    expected = state.count
    for event in events:
        if event.step != expected:
            raise ValueError(f"fold: step {event.step} does not follow step {expected - 1}")
        if not event.checksum:
            raise ValueError(f"fold: step {event.step} is a write-ahead intent")
        expected += 1
    raw = json.dumps([list(e) for e in events], separators=(",", ":")).encode()
    data = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    return CompactionState((*state.chunks, Chunk(events[0].step, events[-1].step, data)))


def expand(state: CompactionState | None) -> list[EncodedEvent]:
    """The compacted events, as encoded (checksums included, so ``verify`` checks them);
    raises :class:`CompactionCorrupt` when a chunk does not hold what it claims."""
    if state is None:
        return []
    events: list[EncodedEvent] = []
    for chunk in state.chunks:
        try:
            rows = json.loads(zlib.decompress(base64.b64decode(chunk.data, validate=True)))
            decoded = [
                EncodedEvent(int(s), int(c), int(t), str(p), str(k)) for s, c, t, p, k in rows
            ]
        except (binascii.Error, zlib.error, ValueError, TypeError) as exc:
            raise CompactionCorrupt(
                f"the compaction checkpoint's chunk of steps {chunk.first_step}-"
                f"{chunk.last_step} cannot be read: {exc}"
            ) from None
        steps = [e.step for e in decoded]
        if steps != list(range(chunk.first_step, chunk.last_step + 1)):
            raise CompactionCorrupt(
                f"the compaction checkpoint's chunk of steps {chunk.first_step}-"
                f"{chunk.last_step} does not hold those steps"
            )
        events.extend(decoded)
    return events


def with_tail(state: CompactionState | None, tail: Sequence[EncodedEvent]) -> list[EncodedEvent]:
    """The whole history: the checkpoint's events, then the rows (which must follow it)."""
    events = expand(state)
    if tail and tail[0].step != len(events):
        raise CompactionCorrupt(
            f"the history rows start at step {tail[0].step}, but the compaction checkpoint "
            f"ends at step {len(events) - 1}"
        )
    events.extend(tail)
    return events


def describe_count(count: int) -> str:
    """The marker pages show for a compacted prefix of ``count`` events."""
    return f"steps 0\u2013{count - 1} compacted"
