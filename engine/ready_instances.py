"""Component instances made ahead of the segments that take them.

Instantiating a Python workflow's component costs about a millisecond of CPU before its
first instruction runs: wasmtime links CPython's core modules, and their start functions
fill the dynamic-linking tables of every function libpython exports. None of that depends on
the run: until the guest is first called, a fresh instance is the same whichever run takes
it. So a segment takes an instance made ahead of it, on a thread of its own
(``cleat-ready-instances``), and asks for another in its place once its guest has stopped
running (while the worker writes the segment's outcome); only when none is ready does it
instantiate inline, as it always did. Not sooner: instantiating maps memory, and the page
faults of a guest running meanwhile wait on the process's memory map -- made while the
segment ran, the next instance cost the segment about as much as it saved.

What a ready instance has done, and what it has not:

- it ran the component's start functions, outside any run, exactly as an instance made
  inline does before its segment binds it (host functions see no run then: no time, no
  random stream, no recorded effect);
- it has never been called: componentize-py seeds the guest's ``random`` from the run's
  random stream on the first call, inside the segment, so a run's values are those it gets
  from an inline instance (a test compares them);
- its store's limits and fuel are the configured ones, spent only by the start functions as
  inline; its epoch deadline is set again when a segment takes it (the time it waited does
  not count against the segment);
- its guest output is routed to the run that takes it (:class:`GuestOutput`).

Bounds: ``per_component`` instances of each component, for at most
:data:`MAX_COMPONENTS` components at once; a further component's segments instantiate inline
until one of those has not been taken for ``idle_s``, when its instances are dropped. (Taking
the least recently run one's place instead thrashed: with one component more than the bound
run in turn, every instance was dropped before its use, three instantiations a segment.) An instance
costs about 0.5 MB of memory. Only a component a segment instantiated inline is made ahead,
and one whose instantiation ahead fails is not made ahead again until a segment instantiates
it inline: a segment's own attempt reports an error to its run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger("cleat.engine")

# Components with instances kept ready at once (a further one waits for one to go idle).
MAX_COMPONENTS = 8
# A component not taken for this long has its ready instances dropped.
IDLE_SECONDS = 600.0

T = TypeVar("T")

# Every pool of the process, reset in a forked child (its maker thread did not follow it,
# and its lock may have been held by that thread at the fork).
_POOLS: weakref.WeakSet[ReadyInstances[Any]] = weakref.WeakSet()
_LEFT_BY_FORK: list[Any] = []


@dataclass
class GuestOutput:
    """Where a store's guest output goes: the session of the segment that runs it, bound when
    the segment takes the store (None before: the output of start functions, logged without
    a run)."""

    session: Any = None


@dataclass
class _Kept(Generic[T]):
    ready: list[T] = field(default_factory=list)
    taken_at: float = 0.0
    # Holds one of the max_components places: made ahead once, until it goes idle (or fails).
    placed: bool = False


@dataclass
class ReadyStats:
    """Counts since the process started: segments that took a ready instance (``hits``) or
    instantiated inline (``misses``); instances made ahead, and dropped unused."""

    hits: int = 0
    misses: int = 0
    made: int = 0
    dropped: int = 0
    failed: int = 0


class ReadyInstances(Generic[T]):
    """Keeps up to ``per_component`` instances of each recently taken component, made by
    ``make(component)`` on a thread of its own. ``key(component)`` names a component (its
    sha256). Thread-safe."""

    def __init__(
        self,
        make: Callable[[Any], T],
        key: Callable[[Any], str],
        per_component: int,
        idle_s: float = IDLE_SECONDS,
        max_components: int = MAX_COMPONENTS,
        dispose: Callable[[T], None] | None = None,
    ) -> None:
        if per_component < 1:
            raise ValueError("per_component must be at least 1")
        self._make = make
        self._dispose = dispose
        self._disposals: list[T] = []  # used items the maker's thread disposes of
        self._key = key
        self.per_component = per_component
        self.idle_s = idle_s
        self.max_components = max_components
        self.stats = ReadyStats()
        self._kept: OrderedDict[str, _Kept[T]] = OrderedDict()  # least recently taken first
        self._wanted: OrderedDict[str, Any] = OrderedDict()  # key -> component to make
        self._failing: set[str] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        _POOLS.add(self)

    def _after_fork(self) -> None:
        """In a forked child: nothing ready (the parent's instances stay the parent's, and
        are not freed here: wasmtime's locks may be held by a thread the fork left behind), a
        new lock, and a maker thread started again on the next take."""
        _LEFT_BY_FORK.append([*self._kept.values(), *self._disposals])
        self._disposals = []
        self._cond = threading.Condition()
        self._kept = OrderedDict()
        self._wanted = OrderedDict()
        self._thread = None

    # --- the segment's side ---

    def take(self, component: Any) -> T | None:
        """A ready instance of ``component``, or None (the caller instantiates inline). The
        caller calls :meth:`replenish` when its guest has stopped running."""
        name = self._key(component)
        with self._cond:
            if self._closed:
                return None
            kept = self._kept.get(name)
            if kept is None:
                kept = self._kept[name] = _Kept()
            kept.taken_at = time.monotonic()
            self._kept.move_to_end(name)
            item = kept.ready.pop() if kept.ready else None
            if item is None:
                self.stats.misses += 1
            else:
                self.stats.hits += 1
            return item

    def replenish(self, component: Any, instantiated_inline: bool = False) -> None:
        """The segment that took an instance of ``component`` (or made its own, if
        ``instantiated_inline``: a failure of the past no longer holds) has stopped running
        its guest: make the instances it used up, while the worker writes its outcome.
        Not sooner: instantiating maps memory, and page faults of a guest running meanwhile
        wait for the process's memory map (measured: the segment lost what it gained)."""
        name = self._key(component)
        with self._cond:
            if instantiated_inline:
                self._failing.discard(name)
            if self._closed or name in self._failing or name not in self._kept:
                return
            self._wanted[name] = component
            self._start()
            self._cond.notify()

    def dispose(self, item: T) -> None:
        """An item a segment used (made ahead or inline), disposed of on the maker's thread
        (``dispose``, e.g. closing its store: unmapping an instance's memory took about
        0.25 ms, which the run's finalize waited for), or here when the pool is closed."""
        if self._dispose is None:
            return
        with self._cond:
            if not self._closed:
                try:
                    self._start()
                except RuntimeError:  # no thread could be started: disposed of here
                    pass
                else:
                    self._disposals.append(item)
                    self._cond.notify()
                    return
        self._dispose_of([item])

    def _dispose_of(self, items: list[T]) -> None:
        assert self._dispose is not None
        for item in items:
            try:
                self._dispose(item)
            except Exception:
                log.warning("could not dispose of a used instance", exc_info=True)

    def ready_count(self, component: Any) -> int:
        with self._cond:
            kept = self._kept.get(self._key(component))
            return len(kept.ready) if kept is not None else 0

    def close(self) -> None:
        """Stop making instances and drop the ready ones."""
        with self._cond:
            self._closed = True
            dropped = sum(len(k.ready) for k in self._kept.values())
            self.stats.dropped += dropped
            self._kept.clear()
            self._wanted.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._cond:
            left, self._disposals = self._disposals, []
        if left:
            self._dispose_of(left)

    # --- the maker's side ---

    def _start(self) -> None:
        # Under the lock. A thread that cannot be started is tried again at the next replenish.
        if self._thread is None:
            thread = threading.Thread(target=self._run, name="cleat-ready-instances", daemon=True)
            thread.start()
            self._thread = thread

    def _next(self) -> tuple[str, Any] | None:
        """The next component to make an instance of (under the lock), dropping what went
        idle; None when there is nothing to make."""
        self._drop_idle()
        while self._wanted:
            name, component = next(iter(self._wanted.items()))
            kept = self._kept.get(name)
            if (
                kept is None
                or name in self._failing
                or len(kept.ready) >= self.per_component
                or (not kept.placed and self._placed() >= self.max_components)
            ):
                del self._wanted[name]
                continue
            kept.placed = True
            return name, component
        return None

    def _placed(self) -> int:
        """Components holding a place (under the lock)."""
        return sum(1 for kept in self._kept.values() if kept.placed)

    def _drop_idle(self) -> None:
        now = time.monotonic()
        for name in list(self._kept):
            kept = self._kept[name]
            if now - kept.taken_at > self.idle_s:
                self.stats.dropped += len(kept.ready)
                del self._kept[name]
                self._wanted.pop(name, None)
            else:
                break  # ordered by the time taken

    def _run(self) -> None:
        while True:
            with self._cond:
                job = None
                while not self._closed and not self._disposals:
                    job = self._next()
                    if job is not None:
                        break
                    self._cond.wait(timeout=min(60.0, self.idle_s))
                disposals, self._disposals = self._disposals, []
                if self._closed and not disposals:
                    return
            if disposals:  # what segments left (their memory)
                self._dispose_of(disposals)
                disposals.clear()  # not kept alive while this thread waits
            if job is None:
                continue
            name, component = job
            try:
                item = self._make(component)
            except Exception as exc:  # reported by the segment's own inline attempt
                log.info("not making %s ready ahead any more: %s", name[:12], exc)
                with self._cond:
                    self.stats.failed += 1
                    self._failing.add(name)
                    kept = self._kept.get(name)
                    if kept is not None:
                        kept.placed = False
                continue
            with self._cond:
                kept = self._kept.get(name)
                if self._closed or kept is None or len(kept.ready) >= self.per_component:
                    self.stats.dropped += 1
                    continue
                kept.ready.append(item)
                self.stats.made += 1


def _reset_after_fork() -> None:
    for pool in list(_POOLS):
        pool._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
