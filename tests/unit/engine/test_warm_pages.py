"""engine.warm_pages: which mappings are memory images, and the runs of pages it populates."""

from __future__ import annotations

from typing import Any

from engine.warm_pages import ImageMapping, WarmPages, _runs, image_mappings

MAPS = b"""\
55d1c0a00000-55d1c0a21000 rw-p 00000000 00:00 0 [heap]
7f36ba0f0000-7f36bacb0000 rw-p 0142d000 00:2a 16040853 /cache/ab-wasmtime50-fuel0.cwasm
7f36bb000000-7f36bb001000 r--p 0142d000 00:2a 16040853 /cache/ab-wasmtime50-fuel0.cwasm
7f36bc000000-7f36bc010000 rw-s 00000000 00:2a 777 /cache/modules/shared.cwasm
7f37c0000000-7f37c0100000 rw-p 00010000 00:01 4242 /memfd:wasm-memory-image (deleted)
7f3be7eeb000-7f3be7eed000 rw-p 016e8000 00:2a 5398540 /venv/wasmtime/_libwasmtime.so
7f3be8000000-7f3be8001000 rw-p 00000000 00:2a 99 /tmp/not-a.cwasm.txt"""


def test_only_writable_private_mappings_of_images_are_images() -> None:
    assert list(image_mappings(MAPS)) == [
        ImageMapping(0x7F36BA0F0000, 0x7F36BACB0000, 0x142D000, 16040853),
        ImageMapping(0x7F37C0000000, 0x7F37C0100000, 0x10000, 4242),
    ]
    assert list(image_mappings(b"")) == []


def test_runs_cover_every_page_and_join_pages_at_most_the_gap_apart() -> None:
    assert list(_runs([7], gap=2)) == [(7, 1)]
    assert list(_runs([1, 2, 3, 5, 9, 10, 20], gap=0)) == [(1, 3), (5, 1), (9, 2), (20, 1)]
    assert list(_runs([1, 2, 3, 5, 9, 10, 20], gap=2)) == [(1, 5), (9, 2), (20, 1)]
    pages = [0, 4, 5, 40, 41, 43, 100]
    covered = {p for start, length in _runs(pages, gap=3) for p in range(start, start + length)}
    assert set(pages) <= covered and len(covered) <= len(pages) + 3 * len(pages)


def test_learning_stops_after_the_first_segments_but_not_for_a_new_component(
    monkeypatch: Any,
) -> None:
    """Pages are learned from the first segments, as the pages every instance that wrote
    any wrote; after those, only a segment that made its own instance (a component's first)
    is learned from."""
    pages = WarmPages(learn_segments=2)
    monkeypatch.setattr(pages, "enabled", True)
    seen: list[dict[int, list[frozenset[int]]]] = [
        {1: [frozenset({1, 2, 3}), frozenset({2, 3, 4})]},  # two instances of image 1
        {1: [frozenset({2, 3, 9})]},
        {1: [frozenset({50})], 2: [frozenset({7, 8})]},
    ]
    monkeypatch.setattr(pages, "_written", lambda: seen.pop(0))
    pages.learn()
    assert pages._learned == {1: frozenset({2, 3})}
    pages.learn()
    assert pages._learned == {1: frozenset({2, 3, 9})} and not pages.learning
    pages.learn()  # a further segment on a known component: nothing read
    assert len(seen) == 1
    pages.learn(new_component=True)
    assert pages._learned == {1: frozenset({2, 3, 9, 50}), 2: frozenset({7, 8})}
