"""engine.ready_instances: instances made ahead on a thread of their own, within bounds.

These use a stand-in ``make`` (no WebAssembly): what is made, when, how much is kept and
what is dropped. The component tests (tests/unit/sdk/test_ready_instances_component.py)
run real Python workflows on ready instances.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from engine.ready_instances import ReadyInstances


class Maker:
    """Makes ``(component, n)`` tuples; ``fail`` names components whose making raises."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.fail: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, component: str) -> tuple[str, int]:
        if component in self.fail:
            raise RuntimeError(f"cannot instantiate {component}")
        with self.lock:
            self.made.append(component)
            return component, len(self.made)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the ready instances")
        time.sleep(0.005)


def use(pool: ReadyInstances[tuple[str, int]], name: str) -> tuple[str, int] | None:
    """A segment of ``name``: takes an instance, runs, and asks for its replacement."""
    item = pool.take(name)
    pool.replenish(name, instantiated_inline=item is None)
    return item


@pytest.fixture
def maker() -> Maker:
    return Maker()


@pytest.fixture
def made_by(maker: Maker) -> Iterator[Callable[..., ReadyInstances[tuple[str, int]]]]:
    pools: list[ReadyInstances[tuple[str, int]]] = []

    def make(**kwargs: float) -> ReadyInstances[tuple[str, int]]:
        pool: ReadyInstances[tuple[str, int]] = ReadyInstances(
            maker, key=str, per_component=int(kwargs.pop("per_component", 2)), **kwargs
        )
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def test_the_first_take_misses_then_instances_are_made_ahead_up_to_the_bound(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    pool = made_by(per_component=2)
    assert pool.take("a") is None  # nothing made yet: the caller instantiates inline
    time.sleep(0.05)
    assert maker.made == []  # nothing is made while the segment runs its guest
    pool.replenish("a", instantiated_inline=True)  # ... only once it is over
    wait_for(lambda: pool.ready_count("a") == 2)
    time.sleep(0.05)
    assert maker.made == ["a", "a"]  # two, not more

    first = pool.take("a")
    assert first is not None and first[0] == "a"
    assert pool.ready_count("a") == 1
    pool.replenish("a")
    wait_for(lambda: pool.ready_count("a") == 2)  # the taken one is replaced
    assert len(maker.made) == 3
    assert (pool.stats.hits, pool.stats.misses, pool.stats.made) == (1, 1, 3)
    # Each instance is handed out once.
    second, third = pool.take("a"), pool.take("a")
    assert second is not None and third is not None
    assert len({first[1], second[1], third[1]}) == 3


def test_only_components_that_were_taken_are_made(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    pool = made_by(per_component=1)
    use(pool, "a")
    wait_for(lambda: pool.ready_count("a") == 1)
    assert pool.ready_count("b") == 0
    assert maker.made == ["a"]


def test_components_beyond_the_bound_wait_for_one_to_go_idle_instead_of_thrashing(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    """Three components run in turn, room for two: the first two keep their instances and
    are served from them; the third instantiates inline. (Taking the least recently run
    one's place dropped every instance before its use: three instantiations a segment.)"""
    pool = made_by(per_component=1, max_components=2, idle_s=0.3)
    for name in ("a", "b", "c"):
        use(pool, name)
        time.sleep(0.02)
    wait_for(lambda: pool.ready_count("a") == 1 and pool.ready_count("b") == 1)
    hits = pool.stats.hits
    for _ in range(10):
        for name in ("a", "b", "c"):
            use(pool, name)
            if name != "c":
                wait_for(lambda name=name: pool.ready_count(name) == 1)  # type: ignore[misc]
    assert pool.ready_count("c") == 0
    assert pool.stats.hits - hits == 20  # every segment of a and b
    assert len(maker.made) == 2 + 20  # one each at first, then one per segment taken
    assert pool.stats.dropped == 0

    time.sleep(0.35)  # a and b go idle; c is run on
    use(pool, "c")
    wait_for(lambda: pool.ready_count("c") == 1)
    assert pool.ready_count("a") == pool.ready_count("b") == 0
    assert pool.stats.dropped == 2


def test_a_component_not_taken_for_the_idle_time_has_its_instances_dropped(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    pool = made_by(per_component=2, idle_s=0.2)
    use(pool, "a")
    wait_for(lambda: pool.ready_count("a") == 2)
    use(pool, "b")  # wakes the maker; "a" is not idle yet
    wait_for(lambda: pool.ready_count("b") == 2)
    assert pool.ready_count("a") >= 1
    time.sleep(0.25)
    use(pool, "b")  # the maker wakes, and "a" has been idle past 0.2 s
    wait_for(lambda: pool.ready_count("a") == 0)
    wait_for(lambda: pool.ready_count("b") == 2)
    assert pool.stats.dropped >= 2


def test_a_component_that_fails_to_instantiate_ahead_is_not_made_again_until_inline_succeeds(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    pool = made_by(per_component=2)
    use(pool, "flaky")  # instantiated inline, then made ahead: that fails
    maker.fail.add("flaky")
    wait_for(lambda: pool.stats.failed == 1)
    for _ in range(3):  # the segments instantiate inline (and report any error themselves)
        assert pool.take("flaky") is None
        pool.replenish("flaky")  # an inline attempt that failed: not a reason to retry
    time.sleep(0.05)
    assert pool.stats.failed == 1  # tried once, not at every segment
    assert pool.ready_count("flaky") == 0

    maker.fail.clear()  # e.g. the memory came back: an inline attempt succeeded
    use(pool, "flaky")
    wait_for(lambda: pool.ready_count("flaky") == 2)


def test_close_stops_the_maker_and_drops_what_is_ready(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    pool = made_by(per_component=2)
    use(pool, "a")
    wait_for(lambda: pool.ready_count("a") == 2)
    pool.close()
    assert pool.take("a") is None
    assert pool.ready_count("a") == 0
    assert pool.stats.dropped == 2
    threads = [t.name for t in threading.enumerate()]
    made = len(maker.made)
    time.sleep(0.05)
    assert len(maker.made) == made
    assert pool._thread is not None and not pool._thread.is_alive(), threads


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="per_component"):
        ReadyInstances(Maker(), key=str, per_component=0)


def test_a_forked_child_starts_with_nothing_ready_and_makes_its_own(
    maker: Maker, made_by: Callable[..., ReadyInstances[tuple[str, int]]]
) -> None:
    import os

    pool = made_by(per_component=1)
    use(pool, "a")
    wait_for(lambda: pool.ready_count("a") == 1)
    read, write = os.pipe()
    pid = os.fork()  # the child reports within 5 s (wait_for) or is killed
    if pid == 0:  # the child: its maker thread did not survive the fork
        code = 1
        try:
            before = pool.ready_count("a")
            use(pool, "a")
            wait_for(lambda: pool.ready_count("a") == 1)
            code = 0 if before == 0 else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    import select
    import signal

    ready, _, _ = select.select([read], [], [], 30)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    answer = os.read(read, 1) if ready else b"timeout"
    os.waitpid(pid, 0)
    assert answer == b"\x00"
    assert pool.ready_count("a") == 1  # the parent's are untouched


def test_used_items_are_disposed_of_on_the_makers_thread_and_inline_once_closed(
    maker: Maker, caplog: pytest.LogCaptureFixture
) -> None:
    """What a segment used goes to ``dispose`` on the maker's thread (the segment does not
    wait for it); one that fails is logged and the maker goes on; after ``close``,
    ``dispose`` runs in the caller."""
    disposed: list[tuple[tuple[str, int], str]] = []

    def dispose(item: tuple[str, int]) -> None:
        if item[1] == -1:
            raise RuntimeError("cannot close")
        disposed.append((item, threading.current_thread().name))

    pool: ReadyInstances[tuple[str, int]] = ReadyInstances(
        maker, key=lambda c: c, per_component=1, dispose=dispose
    )
    try:
        use(pool, "a")
        pool.dispose(("a", -1))
        pool.dispose(("a", 0))
        wait_for(lambda: len(disposed) == 1 and pool.ready_count("a") == 1)
        assert disposed == [(("a", 0), "cleat-ready-instances")]
        assert "could not dispose of a used instance" in caplog.text
    finally:
        pool.close()
    pool.dispose(("a", 7))
    assert disposed[-1] == (("a", 7), threading.current_thread().name)


def test_an_item_is_disposed_of_in_the_caller_when_no_thread_can_be_started(
    maker: Maker, monkeypatch: pytest.MonkeyPatch
) -> None:
    disposed: list[tuple[str, int]] = []
    pool: ReadyInstances[tuple[str, int]] = ReadyInstances(
        maker, key=lambda c: c, per_component=1, dispose=disposed.append
    )

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    try:
        pool.dispose(("a", 1))
        assert disposed == [("a", 1)]
    finally:
        monkeypatch.undo()
        pool.close()
