"""The pages a component's first call touches, in place before a segment calls it.

A component instance's linear memory starts as a copy-on-write mapping of its memory image:
the compiled artifact's file (``.cwasm``, from the disk cache) or a ``memfd`` wasmtime made.
A Python workflow's first call into a fresh instance -- componentize-py's runtime starting,
``random`` reseeded, the SDK reaching the workflow -- writes about 200 pages of that image
and reads about 1,400 more, each write and each read of a page not mapped yet a page fault on
the segment's thread (a read maps up to 16 pages around it): about 270 faults, a trap into the
kernel each and, for a write, a copy of the page.

:class:`WarmPages` learns, per image (the file's inode), which of its pages every instance's
first segments touched: on Linux, ``/proc/self/pagemap`` tells a page copied out of the file
(a written one) from the file's own page mapped (a read one) and from a page not mapped. It
takes the pages written, and those only read, in every instance that wrote any -- a segment
that ran long touched more, and what it alone touched is left out -- after the first
:data:`LEARN_SEGMENTS` segments of the process and after the first segment of each component
that made its own instance (its first in the process), at most :data:`MAX_PAGES` of each
kind. Then, for each instance made ahead (``engine.ready_instances``, on the maker's thread),
it has the kernel make the written pages private (``madvise(MADV_POPULATE_WRITE)``, Linux
5.14) and map the read ones (``MADV_POPULATE_READ`` on one page of each block of 16 they
touch: the kernel maps the block's others with it): the contents do not change, only where
the faults happen. An instance already written (a segment is running in it, or it was warmed
already) is left alone. Measured: the segment's thread took 266 faults before its first call
reached the service without it, 72 with the written pages alone, 5 with both.

Finding the instances' mappings asks the kernel one writable file-backed mapping at a time
(``PROCMAP_QUERY``, Linux 6.11; the text of ``/proc/self/maps`` on an older kernel, about
0.5 ms a read in a worker), and each kind of an instance's pages is populated in one system
call (``process_madvise``, Linux 6.13; one ``madvise`` per run of pages before).

It never writes guest memory itself, and a range that is no longer mapped only fails its
``madvise``; on another system, before Linux 5.14, or when no mapping looks like an image,
it does nothing. ``CLEAT_WARM_PAGES`` (``EngineConfig.warm_pages``, on by default) turns it off:
the maker pays for each page what the segment no longer pays, plus finding the mappings
(``bench/README.md``).
"""

from __future__ import annotations

import ctypes
import errno
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
# Pages a read fault maps around the one read (fault_around_bytes, 64 KiB by default).
FAULT_AROUND_PAGES = 16
MADV_POPULATE_READ = 22  # linux/mman.h, since 5.14
MADV_POPULATE_WRITE = 23
_PRESENT = 1 << 63
_FILE_OR_SHARED = 1 << 61
# Runs of pages: (first page from a mapping's start, length).
_Runs = tuple[tuple[int, int], ...]


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


@dataclass(frozen=True)
class Touched:
    """The pages of an image an instance's first segments touched: ``written`` ones (copied
    out of the file) and ``mapped`` ones only read (the file's own page in its page table;
    the kernel maps up to 16 around each page read)."""

    written: frozenset[int] = frozenset()
    mapped: frozenset[int] = frozenset()


class WarmPages:
    """Learns the pages first segments touch and has them in place in instances made ahead
    (see the module's docstring). Thread-safe; every failure turns it off with a log line."""

    def __init__(self, learn_segments: int = LEARN_SEGMENTS, max_pages: int = MAX_PAGES) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.enabled = sys.platform.startswith("linux") and os.path.exists("/proc/self/pagemap")
        self.max_pages = max_pages
        self._learned: dict[int, Touched] = {}  # inode -> page numbers in the image
        self._components: set[str] = set()  # components whose first segment was learned from
        # (inode, first page, pages) of a mapping -> the runs of pages to write and to map.
        self._plans: dict[tuple[int, int, int], tuple[_Runs, _Runs]] = {}
        self._learning_left = learn_segments
        self._lock = threading.Lock()
        self._madvise: Any = None
        self._maps = _ImageMaps()
        if self.enabled:
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            self._madvise = madvise
        self._batch: _BatchMadvise | None = _BatchMadvise.open() if self.enabled else None
        self.warmed = 0  # instances whose pages were made private ahead

    @property
    def learning(self) -> bool:
        return self.enabled and self._learning_left > 0

    def learned(self) -> dict[int, tuple[int, int]]:
        """Pages known per image inode: (written, only read)."""
        with self._lock:
            return {
                inode: (len(pages.written), len(pages.mapped))
                for inode, pages in self._learned.items()
            }

    def learn(self, component: str | None = None) -> None:
        """After a segment's guest stopped (its thread): note what the live instances touched.
        Done for the process's first segments, and for the first segment of a ``component``
        (its key) that made its own instance: a component's first segment in the process,
        whose image may not be known yet. Not for every segment that made its own instance:
        in a worker running more segments at once than instances are made ahead, that is
        most of them, and each read of every live instance's page map (thousands of entries
        each) held the lock the others wait on -- the worker ran at a sixth of its rate."""
        with self._lock:
            if not self.enabled:
                return
            new = component is not None and component not in self._components
            if not (self._learning_left > 0 or new):
                return
            self._learning_left = max(0, self._learning_left - 1)
            if component is not None:
                self._components.add(component)
            try:
                touched = self._touched()
            except OSError as exc:
                self._off(f"cannot read the process's page map: {exc}")
                return
            for inode, instances in touched.items():
                known = self._learned.get(inode, Touched())
                written = known.written | frozenset.intersection(*(t.written for t in instances))
                mapped = known.mapped | frozenset.intersection(*(t.mapped for t in instances))
                pages = Touched(written, mapped - written)
                small = len(written) <= self.max_pages and len(mapped) <= self.max_pages
                if small and pages != known:
                    self._learned[inode] = pages
                    self._plans = {k: v for k, v in self._plans.items() if k[0] != inode}

    def warm(self) -> None:
        """On the maker's thread, after an instance was made: have the learned pages of every
        image mapping not written yet in place (written ones private, read ones mapped)."""
        with self._lock:
            if not self.enabled or not self._learned:
                return
            learned = self._learned
        try:
            mappings = self._maps.images(learned.keys())
            fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        except OSError as exc:
            self._off(f"cannot read the process's memory map: {exc}")
            return
        try:
            for mapping in mappings:
                writes, reads = self._plan(mapping, learned)
                if not writes or self._written_page(fd, mapping.start // self.page + writes[0][0]):
                    continue  # in use, or made private already
                try:
                    self._populate(mapping, writes, MADV_POPULATE_WRITE)
                    self._populate(mapping, reads, MADV_POPULATE_READ)
                except _NoPopulate:
                    self._off("this kernel cannot populate pages (before Linux 5.14)")
                    return
                self.warmed += 1
        finally:
            os.close(fd)

    def _plan(self, mapping: ImageMapping, learned: dict[int, Touched]) -> tuple[_Runs, _Runs]:
        """The runs of learned pages (first page from the mapping's start, length) to make
        private and to map in ``mapping``: the same for every instance of an image, so made
        once."""
        first = mapping.offset // self.page
        count = (mapping.end - mapping.start) // self.page
        key = (mapping.inode, first, count)
        plan = self._plans.get(key)
        if plan is None:
            wanted = learned.get(mapping.inode, Touched())

            def runs(pages: frozenset[int]) -> _Runs:
                inside = sorted(p - first for p in pages if first <= p < first + count)
                return tuple(_runs(inside)) if inside else ()

            plan = (runs(wanted.written), _one_a_block(runs(wanted.mapped)))
            with self._lock:
                if self._learned.get(mapping.inode) is wanted:
                    self._plans[key] = plan
        return plan

    def _populate(self, mapping: ImageMapping, runs: _Runs, advice: int) -> None:
        """``madvise(advice)`` each run of pages of ``mapping``: in one ``process_madvise``
        system call where the kernel takes it (Linux 6.13 for these advices), else one
        ``madvise`` a run. A range no longer mapped ends the call (nothing to warm there);
        raises :class:`_NoPopulate` when the kernel has no such advice."""
        if not runs:
            return
        page = self.page
        ranges = [(mapping.start + index * page, length * page) for index, length in runs]
        if self._batch is not None and self._batch.populate(ranges, advice):
            return
        for address, length in ranges:
            if self._madvise(address, length, advice) != 0:
                if ctypes.get_errno() == errno.EINVAL:
                    raise _NoPopulate
                return  # unmapped meanwhile (ENOMEM, EFAULT): nothing to warm there

    def close(self) -> None:
        """Off for good, its descriptors closed (the runtime's close, the maker stopped)."""
        with self._lock:
            self.enabled = False
        self._maps.close()
        if self._batch is not None:
            self._batch.close()

    # --- internals ---

    def _touched(self) -> dict[int, list[Touched]]:
        """Per image inode, the pages touched in each mapping that has any written."""
        mappings = _current_mappings()
        found: dict[int, list[Touched]] = {}
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            for mapping in mappings:
                count = (mapping.end - mapping.start) // self.page
                entries = os.pread(fd, 8 * count, (mapping.start // self.page) * 8)
                first = mapping.offset // self.page
                written: set[int] = set()
                mapped: set[int] = set()
                for i, (entry,) in enumerate(struct.iter_unpack("<Q", entries)):
                    if entry & _PRESENT:
                        (mapped if entry & _FILE_OR_SHARED else written).add(first + i)
                if written:
                    touched = Touched(frozenset(written), frozenset(mapped))
                    found.setdefault(mapping.inode, []).append(touched)
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


class _NoPopulate(Exception):
    """The kernel has no ``MADV_POPULATE_WRITE``."""


class _ProcmapQuery(ctypes.Structure):
    """``struct procmap_query`` (linux/fs.h, Linux 6.11)."""

    _fields_ = [
        *(
            (name, ctypes.c_uint64)
            for name in (
                "size",
                "query_flags",
                "query_addr",
                "vma_start",
                "vma_end",
                "vma_flags",
                "vma_page_size",
                "vma_offset",
                "inode",
            )
        ),
        *(
            (name, ctypes.c_uint32)
            for name in ("dev_major", "dev_minor", "vma_name_size", "build_id_size")
        ),
        ("vma_name_addr", ctypes.c_uint64),
        ("build_id_addr", ctypes.c_uint64),
    ]


# _IOWR('f', 17, struct procmap_query)
PROCMAP_QUERY = (3 << 30) | (ctypes.sizeof(_ProcmapQuery) << 16) | (ord("f") << 8) | 17
_QUERY_WRITABLE = 0x02
_QUERY_SHARED = 0x08
_QUERY_COVERING_OR_NEXT = 0x10
_QUERY_FILE_BACKED = 0x20
_NAME_MAX = 4096


class _ImageMaps:
    """The process's image mappings of given inodes, found with ``PROCMAP_QUERY`` (Linux
    6.11): one ``ioctl`` per writable file-backed mapping (a few dozen in a worker, the
    libraries' data included), the path asked for only of those with an image's inode. The
    kernel writing out the whole map as text instead (``/proc/self/maps``, hundreds of lines:
    every instance maps several ranges) cost about 0.5 ms an instance made ahead; that is
    the fallback on older kernels. Not thread-safe: the maker's thread alone calls it."""

    def __init__(self) -> None:
        self._query_works = sys.platform.startswith("linux")
        self._ioctl: Any = None
        self._fd = -1
        self._pid = -1
        # Two queries, filled in once: one walks the mappings, one asks for a path.
        self._walk = self._new_query()
        self._named = self._new_query()
        self._name = ctypes.create_string_buffer(_NAME_MAX)
        self._named.vma_name_addr = ctypes.addressof(self._name)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    @staticmethod
    def _new_query() -> _ProcmapQuery:
        query = _ProcmapQuery()
        query.size = ctypes.sizeof(query)
        query.query_flags = _QUERY_COVERING_OR_NEXT | _QUERY_FILE_BACKED | _QUERY_WRITABLE
        return query

    def images(self, inodes: Any) -> list[ImageMapping]:
        if self._query_works:
            try:
                return self._queried(frozenset(inodes))
            except OSError as exc:
                if exc.errno not in (errno.ENOTTY, errno.EINVAL, errno.ENOSYS):
                    raise
                self._query_works = False  # a kernel before 6.11
        return [m for m in _current_mappings() if m.inode in inodes]

    def _queried(self, inodes: frozenset[int]) -> list[ImageMapping]:
        if self._ioctl is None:
            # The GIL is kept: each call is a microsecond or two in the kernel.
            ioctl = ctypes.PyDLL(None, use_errno=True).ioctl
            ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
            ioctl.restype = ctypes.c_int
            self._ioctl = ioctl
        if self._pid != os.getpid():  # first call, or a forked child: its own memory map
            self.close()  # a forked child's copy of its parent's
            self._fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
            self._pid = os.getpid()
        fd, ioctl, walk, named = self._fd, self._ioctl, self._walk, self._named
        walk_at, named_at = ctypes.addressof(walk), ctypes.addressof(named)
        found: list[ImageMapping] = []
        walk.query_addr = 0
        while ioctl(fd, PROCMAP_QUERY, walk_at) == 0:
            walk.query_addr = walk.vma_end
            if walk.inode in inodes and not walk.vma_flags & _QUERY_SHARED:
                named.query_addr = walk.vma_start
                named.vma_name_size = _NAME_MAX
                if ioctl(fd, PROCMAP_QUERY, named_at) != 0:
                    self._failed()
                    continue
                name = self._name.value
                if named.vma_start == walk.vma_start and (
                    name.endswith(b".cwasm") or b"wasm-memory-image" in name
                ):
                    found.append(
                        ImageMapping(walk.vma_start, walk.vma_end, walk.vma_offset, walk.inode)
                    )
        self._failed()
        return found

    @staticmethod
    def _failed() -> None:
        """After a query that failed: past the last mapping (``ENOENT``) is no error."""
        code = ctypes.get_errno()
        if code != errno.ENOENT:
            raise OSError(code, os.strerror(code))


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_SYS_PROCESS_MADVISE = 440  # the same number on every Linux architecture
_UIO_MAXIOV = 1024


class _BatchMadvise:
    """``process_madvise`` on the process itself: many ranges, one system call (an instance's
    ~170 learned pages lie in about a hundred runs). Linux 6.13 takes any advice for the
    caller's own process; an older one refuses ``MADV_POPULATE_WRITE`` there
    (``EINVAL``), and the ranges are then advised one call each."""

    def __init__(self, syscall: Any) -> None:
        self._syscall = syscall
        self._pid = -1
        self._pidfd = -1
        self._works = True

    @classmethod
    def open(cls) -> _BatchMadvise | None:
        if not hasattr(os, "pidfd_open"):
            return None
        syscall = ctypes.CDLL(None, use_errno=True).syscall
        syscall.restype = ctypes.c_long
        return cls(syscall)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
        self._pidfd, self._pid = -1, -1

    def populate(self, ranges: list[tuple[int, int]], advice: int) -> bool:
        """Whether ``ranges`` were populated here (True also when one was unmapped
        meanwhile: there is nothing to warm then); False: advise them one by one."""
        if not self._works:
            return False
        if self._pid != os.getpid():  # first call, or a forked child: its own pidfd
            self.close()  # a forked child's copy of its parent's
            try:
                self._pidfd = os.pidfd_open(os.getpid())
            except OSError:
                self._works = False
                return False
            self._pid = os.getpid()
        for at in range(0, len(ranges), _UIO_MAXIOV):
            chunk = ranges[at : at + _UIO_MAXIOV]
            vector = (_Iovec * len(chunk))(*(_Iovec(a, n) for a, n in chunk))
            done = self._syscall(
                ctypes.c_long(_SYS_PROCESS_MADVISE),
                ctypes.c_int(self._pidfd),
                vector,
                ctypes.c_size_t(len(chunk)),
                ctypes.c_int(advice),
                ctypes.c_uint(0),
            )
            if done < 0:
                code = ctypes.get_errno()
                if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EBADF):
                    self._works = False  # before 6.13, or no such call: one madvise a range
                    return False
                return True  # unmapped meanwhile: nothing to warm there
            if done < sum(length for _, length in chunk):
                return True
        return True


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


def _one_a_block(runs: _Runs, block: int = FAULT_AROUND_PAGES) -> _Runs:
    """One page of ``runs`` in each aligned block of ``block`` pages they touch: a read fault
    maps the block's other pages that are in the page cache with it (the kernel's
    fault-around), so populating that one page maps the block for a sixteenth of the
    work."""
    firsts: list[int] = []
    for start, length in runs:
        page = start
        while page < start + length:
            if not firsts or firsts[-1] // block != page // block:
                firsts.append(page)
            page = (page // block + 1) * block
    return tuple((page, 1) for page in firsts)


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
