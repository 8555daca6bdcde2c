"""The pages a component's first call writes, made private before a segment calls it.

A component instance's linear memory starts as a copy-on-write mapping of its memory image:
the compiled artifact's file (``.cwasm``, from the disk cache) or a ``memfd`` wasmtime made.
A Python workflow's first call into a fresh instance -- componentize-py's runtime starting,
``random`` reseeded, the SDK reaching the workflow -- writes about 270 pages of that image,
each one a page fault on the segment's thread: a trap into the kernel and a copy of the page
(measured: 1.6 ms from a segment's start to its first ``ctx.call``, 1.0 ms once the pages were
made private ahead).

:class:`WarmPages` learns, per image (the file's inode), which of its pages every instance's
first segments wrote: on Linux, ``/proc/self/pagemap`` tells a page copied out of the file (a
written one) from the file's own page. It takes the pages written in every instance that
wrote any -- a segment that ran long wrote more, and what it alone wrote is left out -- after
the first :data:`LEARN_SEGMENTS` segments of the process and after each segment that made its
own instance (a component's first in the process), at most :data:`MAX_PAGES` of an image.
Then, for each instance made ahead (``engine.ready_instances``, on the maker's thread), it has
the kernel make those pages private (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14): the
contents do not change, only where the faults happen. An instance already written (a segment
is running in it, or it was made private already) is left alone.

It never writes guest memory itself, and a range that is no longer mapped only fails its
``madvise``; on another system, an older kernel, or when no mapping looks like an image, it
does nothing. It is off unless ``CLEAT_WARM_PAGES`` (``EngineConfig.warm_pages``) is on: the
maker pays for each page what the segment no longer pays, and reading the process's memory
map on top (about 1 ms of CPU an instance against 0.5 ms of the segment's start:
``bench/README.md``), so it buys latency with CPU, worth it where a core is to spare.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("cleat.engine")

# Segments the process learns from; then the pages are known.
LEARN_SEGMENTS = 3
# At most this many pages of one image are made private ahead (16 MiB of 4 KiB pages).
MAX_PAGES = 4096
# Learned pages this close together are made private in one call, with the pages between.
GAP_PAGES = 2
MADV_POPULATE_WRITE = 23  # linux/mman.h, since 5.14
_PRESENT = 1 << 63
_FILE_OR_SHARED = 1 << 61


@dataclass(frozen=True)
class ImageMapping:
    """One instance's mapping of a memory image: its address range, where in the image it
    starts, and the image's inode."""

    start: int
    end: int
    offset: int
    inode: int


def image_mappings(maps: bytes) -> Iterator[ImageMapping]:
    """The writable private mappings of memory images in ``maps`` (``/proc/self/maps``)."""
    for line in _lines_naming(maps, (b".cwasm\n", b"wasm-memory-image")):
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[1].startswith(b"rw") or fields[1][3:4] != b"p":
            continue
        path = fields[5].strip()
        if not (path.endswith(b".cwasm") or b"wasm-memory-image" in path):
            continue
        low, _, high = fields[0].partition(b"-")
        yield ImageMapping(int(low, 16), int(high, 16), int(fields[2], 16), int(fields[4]))


class WarmPages:
    """Learns the pages first segments write and makes them private in instances made ahead
    (see the module's docstring). Thread-safe; every failure turns it off with a log line."""

    def __init__(self, learn_segments: int = LEARN_SEGMENTS, max_pages: int = MAX_PAGES) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.enabled = sys.platform.startswith("linux") and os.path.exists("/proc/self/pagemap")
        self.max_pages = max_pages
        self._learned: dict[int, frozenset[int]] = {}  # inode -> page numbers in the image
        self._learning_left = learn_segments
        self._lock = threading.Lock()
        self._madvise: Any = None
        if self.enabled:
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            self._madvise = madvise
        self.warmed = 0  # instances whose pages were made private ahead

    @property
    def learning(self) -> bool:
        return self.enabled and self._learning_left > 0

    def learned(self) -> dict[int, int]:
        """Pages known per image inode."""
        with self._lock:
            return {inode: len(pages) for inode, pages in self._learned.items()}

    def learn(self, new_component: bool = False) -> None:
        """After a segment's guest stopped (its thread): note what the live instances wrote.
        Done for the process's first segments, and for one that made its own instance
        (``new_component``: a component's first segment in the process, whose image may not
        be known yet)."""
        with self._lock:
            if not self.enabled or not (self._learning_left > 0 or new_component):
                return
            self._learning_left = max(0, self._learning_left - 1)
            try:
                written = self._written()
            except OSError as exc:
                self._off(f"cannot read the process's page map: {exc}")
                return
            for inode, sets in written.items():
                common = frozenset.intersection(*sets)
                known = self._learned.get(inode)
                pages = common if known is None else known | common
                if len(pages) <= self.max_pages:
                    self._learned[inode] = pages

    def warm(self) -> None:
        """On the maker's thread, after an instance was made: make the learned pages of every
        image mapping not written yet private."""
        with self._lock:
            if not self.enabled or not self._learned:
                return
            learned = dict(self._learned)
        try:
            mappings = _current_mappings()
            fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        except OSError as exc:
            self._off(f"cannot read the process's memory map: {exc}")
            return
        try:
            for mapping in mappings:
                wanted = learned.get(mapping.inode)
                if not wanted:
                    continue
                first = mapping.offset // self.page
                count = (mapping.end - mapping.start) // self.page
                pages = sorted(p - first for p in wanted if first <= p < first + count)
                if not pages or self._written_page(fd, mapping.start // self.page + pages[0]):
                    continue  # in use, or made private already
                for index, run in _runs(pages):
                    address = mapping.start + index * self.page
                    if self._madvise(address, run * self.page, MADV_POPULATE_WRITE) != 0:
                        errno = ctypes.get_errno()
                        if errno == 22:  # EINVAL: a kernel without MADV_POPULATE_WRITE
                            self._off("this kernel cannot populate pages (before Linux 5.14)")
                            return
                        break  # unmapped meanwhile (ENOMEM, EFAULT): nothing to warm there
                self.warmed += 1
        finally:
            os.close(fd)

    # --- internals ---

    def _written(self) -> dict[int, list[frozenset[int]]]:
        """Per image inode, the written pages of each mapping that has any."""
        mappings = _current_mappings()
        found: dict[int, list[frozenset[int]]] = {}
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            for mapping in mappings:
                count = (mapping.end - mapping.start) // self.page
                entries = os.pread(fd, 8 * count, (mapping.start // self.page) * 8)
                first = mapping.offset // self.page
                pages = frozenset(
                    first + i
                    for i, (entry,) in enumerate(struct.iter_unpack("<Q", entries))
                    if _is_written(entry)
                )
                if pages:
                    found.setdefault(mapping.inode, []).append(pages)
        finally:
            os.close(fd)
        return found

    def _written_page(self, fd: int, page_number: int) -> bool:
        (entry,) = struct.unpack("<Q", os.pread(fd, 8, page_number * 8))
        return _is_written(entry)

    def _off(self, why: str) -> None:
        if self.enabled:
            log.info("not making component pages private ahead: %s", why)
        self.enabled = False


def _current_mappings() -> list[ImageMapping]:
    """The process's image mappings now."""
    with open("/proc/self/maps", "rb") as f:
        return list(image_mappings(f.read()))


def _is_written(entry: int) -> bool:
    """Whether a page map entry is a page present and copied out of its file (written)."""
    return bool(entry & _PRESENT and not entry & _FILE_OR_SHARED)


def _lines_naming(text: bytes, needles: tuple[bytes, ...]) -> Iterator[bytes]:
    """The lines of ``text`` holding one of ``needles`` (without splitting the others: the
    map has hundreds of lines, a handful of them images)."""
    for needle in needles:
        at = text.find(needle)
        while at != -1:
            start = text.rfind(b"\n", 0, at) + 1
            end = text.find(b"\n", at)
            end = len(text) if end == -1 else end
            yield text[start:end] + b"\n"
            at = text.find(needle, end)


def _runs(pages: list[int], gap: int = GAP_PAGES) -> Iterator[tuple[int, int]]:
    """(first, length) of runs covering sorted ``pages``: consecutive ones, and those at most
    ``gap`` pages apart (a page made private needlessly costs less than a system call)."""
    start = previous = pages[0]
    for page in pages[1:]:
        if page > previous + 1 + gap:
            yield start, previous - start + 1
            start = page
        previous = page
    yield start, previous - start + 1
