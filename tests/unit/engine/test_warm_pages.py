"""engine.warm_pages: which mappings are memory images, what it learns, and the pages it
populates."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine.warm_pages import (
    ImageMapping,
    Touched,
    WarmPages,
    _ImageMaps,
    _is_written,
    _one_a_block,
    _runs,
    image_mappings,
)

# The page maps, mapping queries and page population are Linux's (the CI machine's).
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc/self/pagemap and madvise are Linux's"
)

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
    any wrote, and the pages every such instance only read; after those, only the first
    segment of a component that made its own instance is learned from -- once per
    component, not at every instance made inline."""
    pages = WarmPages(learn_segments=2)
    monkeypatch.setattr(pages, "enabled", True)

    def seen_as(written: set[int], read: set[int] | None = None) -> Touched:
        return Touched(frozenset(written), frozenset(read or ()))

    seen: list[dict[int, list[Touched]]] = [
        # two instances of image 1
        {1: [seen_as({1, 2, 3}, {20, 21, 22}), seen_as({2, 3, 4}, {21, 22, 23})]},
        {1: [seen_as({2, 3, 9}, {21, 30})]},
        {1: [seen_as({50}, {4})], 2: [seen_as({7, 8})]},
        {3: [seen_as({5})]},
    ]
    monkeypatch.setattr(pages, "_touched", lambda: seen.pop(0))
    pages.learn()
    assert pages._learned == {1: seen_as({2, 3}, {21, 22})}
    pages.learn("component-a")  # still among the first segments: learned, and a is known
    assert pages._learned == {1: seen_as({2, 3, 9}, {21, 22, 30})} and not pages.learning
    pages.learn()  # a further segment on a known component: nothing read
    pages.learn("component-a")  # a made its own instance again: nothing read
    assert len(seen) == 2
    pages.learn("component-b")
    # What a new component's segment touched is added (4: read there, written by none).
    assert pages._learned == {
        1: seen_as({2, 3, 9, 50}, {4, 21, 22, 30}),
        2: seen_as({7, 8}),
    }
    assert pages.learned() == {1: (4, 4), 2: (2, 0)}
    pages.learn("component-b")
    assert len(seen) == 1


def test_a_page_learned_as_written_is_not_also_learned_as_read(monkeypatch: Any) -> None:
    pages = WarmPages(learn_segments=2)
    monkeypatch.setattr(pages, "enabled", True)
    seen = [
        {1: [Touched(frozenset({1}), frozenset({2, 3}))]},
        {1: [Touched(frozenset({2}), frozenset({3}))]},
    ]
    monkeypatch.setattr(pages, "_touched", lambda: seen.pop(0))
    pages.learn()
    pages.learn()
    assert pages._learned == {1: Touched(frozenset({1, 2}), frozenset({3}))}


PAGE = mmap.PAGESIZE


@contextmanager
def mapped_image(tmp_path: Path, name: str, pages: int = 8, shared: bool = False) -> Iterator[Any]:
    """A file named ``name`` mapped writable and private (copy-on-write, as wasmtime maps a
    memory image), or shared; yields (address, inode)."""
    path = tmp_path / name
    path.write_bytes(bytes(range(256)) * (pages * PAGE // 256))
    with open(path, "r+b") as f:
        flags = mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE
        mapping = mmap.mmap(f.fileno(), pages * PAGE, flags=flags)
    anchor = ctypes.c_char.from_buffer(mapping)
    try:
        yield ctypes.addressof(anchor), os.stat(path).st_ino
    finally:
        del anchor
        mapping.close()


def page_states(address: int, pages: int) -> tuple[list[int], list[int]]:
    """The pages of ``address``'s mapping copied out of their file (written), and those
    mapped from the file (read)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(address // PAGE * 8)
        entries = struct.unpack(f"<{pages}Q", f.read(8 * pages))
    written = [i for i, entry in enumerate(entries) if _is_written(entry)]
    mapped = [i for i, entry in enumerate(entries) if entry >> 63 and entry >> 61 & 1]
    return written, mapped


@linux_only
@pytest.mark.parametrize("by_query", [True, False], ids=["procmap-query", "maps-text"])
def test_image_mappings_are_found_by_inode_and_name(tmp_path: Path, by_query: bool) -> None:
    """The private writable mappings of images with a learned inode, found one ioctl a
    mapping (PROCMAP_QUERY) or, on an older kernel, in the text of /proc/self/maps: a file
    that is not an image, or an image mapped shared, is not one."""
    maps = _ImageMaps()
    maps._query_works = by_query
    with (
        mapped_image(tmp_path, "a-fuel0.cwasm") as (address, inode),
        mapped_image(tmp_path, "data.bin") as (_, other),
        mapped_image(tmp_path, "b.cwasm", shared=True) as (_, shared),
    ):
        found = maps.images({inode, other, shared})
        assert found == [ImageMapping(address, address + 8 * PAGE, 0, inode)]
        assert maps.images({other}) == []
    assert maps._query_works is by_query  # this kernel answers the query (Linux 6.11)


@linux_only
@pytest.mark.parametrize("batched", [True, False], ids=["process_madvise", "madvise"])
def test_learned_pages_are_made_private_once_per_mapping(tmp_path: Path, batched: bool) -> None:
    """warm() makes the learned written pages of an image mapping not written yet private (a
    copy of the file's page, the contents unchanged) and maps the learned read ones, in one
    system call each or one per run of pages, and leaves a mapping already written alone."""
    pages = WarmPages()
    if not batched:
        pages._batch = None
    with mapped_image(tmp_path, "c.cwasm", pages=16) as (address, inode):
        before = (tmp_path / "c.cwasm").read_bytes()
        pages._learned = {inode: Touched(frozenset({1, 2, 9}), frozenset({12, 13}))}
        pages.warm()
        written, mapped = page_states(address, 16)
        # The kernel may map a few more around a page it maps for reading (fault-around).
        assert written == [1, 2, 9] and {12, 13} <= set(mapped), (written, mapped)
        assert ctypes.string_at(address, 16 * PAGE) == before
        assert pages.warmed == 1 and pages.enabled
        pages.warm()  # written already: not counted again
        assert pages.warmed == 1
    if batched:
        assert pages._batch is not None and pages._batch._works  # this kernel (Linux 6.13)


def test_pages_read_are_populated_one_a_fault_around_block() -> None:
    """Of the runs of pages read, one page in each aligned block of 16 (the kernel maps the
    block's others with it)."""
    assert _one_a_block(((3, 2), (9, 1), (15, 3), (40, 40)), block=16) == (
        (3, 1),
        (16, 1),
        (40, 1),
        (48, 1),
        (64, 1),
    )
    assert _one_a_block(()) == ()


@linux_only
def test_a_forked_child_warms_its_own_mappings(tmp_path: Path) -> None:
    """The mapping queries and the batched madvise hold descriptors of the process that
    opened them: a forked worker (``runworker --processes N``) opens its own."""
    pages = WarmPages()
    with mapped_image(tmp_path, "parent.cwasm") as (address, inode):
        pages._learned = {inode: Touched(frozenset({2}), frozenset())}
        pages.warm()  # the parent's descriptors are open now
        assert page_states(address, 8)[0] == [2]
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it warmed its own new mapping
        code = 1
        try:
            with mapped_image(tmp_path, "child.cwasm") as (address, inode):
                pages._learned = {inode: Touched(frozenset({1, 5}), frozenset())}
                pages.warm()
                written = page_states(address, 8)[0]
                if written == [1, 5] and pages.enabled and pages._batch and pages._batch._works:
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@linux_only
def test_close_turns_it_off_and_closes_its_descriptors(tmp_path: Path) -> None:
    """Each runtime's warm pages hold a descriptor of the memory map and a pidfd once they
    warmed: its close (the runtime's) gives them back."""
    pages = WarmPages()
    with mapped_image(tmp_path, "d.cwasm") as (_, inode):
        pages._learned = {inode: Touched(frozenset({1}), frozenset())}
        before = len(os.listdir("/proc/self/fd"))
        pages.warm()
        assert len(os.listdir("/proc/self/fd")) == before + 2
        pages.close()
        assert len(os.listdir("/proc/self/fd")) == before and not pages.enabled
        pages.warm()  # off: nothing opened again
        assert len(os.listdir("/proc/self/fd")) == before
