"""engine.compaction: what a fold takes, the checkpoint's round trip, and what expanding a
damaged checkpoint says."""

from __future__ import annotations

import pytest

from engine import compaction
from engine.compaction import KEEP_TAIL, CompactionCorrupt, CompactionState
from engine.events import EncodedEvent, checksum, verify


def event(step: int, *, pending: bool = False) -> EncodedEvent:
    payload = f'{{"n":{step}}}'
    return EncodedEvent(
        step, 16, 1000 + step, payload, "" if pending else checksum(step, 16, 1000 + step, payload)
    )


def events(first: int, count: int) -> list[EncodedEvent]:
    return [event(s) for s in range(first, first + count)]


def test_nothing_is_folded_below_the_threshold_or_with_compaction_off() -> None:
    assert compaction.fold_count(events(0, 499), 500) == 0
    assert compaction.fold_count(events(0, 5000), 0) == 0
    assert not compaction.due(499, 500) and compaction.due(500, 500)
    assert not compaction.due(10_000, 0)


def test_a_fold_keeps_the_tail_and_stops_before_a_write_ahead_intent() -> None:
    assert compaction.fold_count(events(0, 500), 500) == 500 - KEEP_TAIL
    rows = events(0, 500)
    rows[250] = event(250, pending=True)
    assert compaction.fold_count(rows, 500) == 250
    # A tiny threshold (tests) keeps half of it.
    assert compaction.fold_count(events(0, 4), 4) == 2
    assert compaction.fold_count(events(0, 3), 1) == 2


def test_folds_append_chunks_and_expand_gives_the_events_back_exactly() -> None:
    history = events(0, 1200)
    state = compaction.fold(None, history[:400])
    state = compaction.fold(state, history[400:900])
    assert (state.count, state.through_step, len(state.chunks)) == (900, 899, 2)
    stored = CompactionState.from_json(state.as_json())
    assert stored == state
    assert compaction.expand(stored) == history[:900]
    assert all(verify(e) for e in compaction.expand(stored))
    assert compaction.with_tail(stored, history[900:]) == history
    assert compaction.describe_count(state.count) == "steps 0\u2013899 compacted"


def test_a_fold_refuses_a_gap_or_an_intent() -> None:
    state = compaction.fold(None, events(0, 10))
    with pytest.raises(ValueError, match="does not follow"):
        compaction.fold(state, events(11, 5))
    with pytest.raises(ValueError, match="write-ahead intent"):
        compaction.fold(state, [event(10, pending=True)])


def test_a_damaged_checkpoint_is_named() -> None:
    good = compaction.fold(compaction.fold(None, events(0, 10)), events(10, 10)).as_json()
    with pytest.raises(CompactionCorrupt, match="format version 1"):
        CompactionState.from_json({**good, "version": 9})
    with pytest.raises(CompactionCorrupt, match="not contiguous"):
        CompactionState.from_json({**good, "chunks": good["chunks"][1:]})
    with pytest.raises(CompactionCorrupt, match="compacted_step"):
        CompactionState.from_json({**good, "compacted_step": 3})
    broken = {**good, "chunks": [[0, 9, "bm90IHpsaWI="], good["chunks"][1]]}
    with pytest.raises(CompactionCorrupt, match="steps 0-9 cannot be read"):
        compaction.expand(CompactionState.from_json(broken))
    swapped = {**good, "chunks": [[0, 9, good["chunks"][1][2]], [10, 19, good["chunks"][0][2]]]}
    with pytest.raises(CompactionCorrupt, match="does not hold those steps"):
        compaction.expand(CompactionState.from_json(swapped))
    with pytest.raises(CompactionCorrupt, match="rows start at step 25"):
        compaction.with_tail(CompactionState.from_json(good), events(25, 3))


def test_an_altered_event_in_a_checkpoint_fails_its_checksum() -> None:
    history = events(0, 20)
    history[5] = history[5]._replace(payload='{"n":55}')
    expanded = compaction.expand(compaction.fold(None, history))
    assert [verify(e) for e in expanded].count(False) == 1
