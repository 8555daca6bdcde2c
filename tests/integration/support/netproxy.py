"""A TCP proxy that misbehaves on command, between worker processes and their database.

The proxy listens on 127.0.0.1 (a random port) and forwards every connection to the
database; an asyncio loop in a thread of the test process copies bytes both ways. Its modes,
set at any moment from the test:

* ``delay(seconds)``: every chunk of bytes, either way, waits that long (a slow network);
* ``drop(True)``: new connections are accepted and closed at once, before a byte is
  forwarded (a server that resets connections); ``drop(False)`` accepts them again;
* ``cut()``: every open connection is closed now, both sides (a failover, a pooler restart,
  a cable pulled and put back);
* ``pause()`` / ``resume()``: a partition -- connections stay open and new ones are
  accepted, but no byte crosses in either direction until ``resume()``; what was sent
  meanwhile is delivered then (TCP's retransmission after a partition heals), unless the
  waiting side gave up first.

``stats`` counts connections accepted, dropped and cut, and bytes forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class ProxyStats:
    accepted: int = 0
    dropped: int = 0
    cut: int = 0
    bytes: int = 0


class FaultyProxy:
    CHUNK = 65536

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.stats = ProxyStats()
        self._delay_s = 0.0
        self._drop = False
        self._flowing: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- test controls (from any thread) ------------------------------------------------------

    def delay(self, seconds: float) -> None:
        self._delay_s = seconds

    def drop(self, on: bool = True) -> None:
        self._drop = on

    def cut(self) -> int:
        """Close every open connection; returns how many pairs were cut."""
        return self._call(self._cut_all)

    def pause(self) -> None:
        self._call(lambda: self._flow().clear())

    def resume(self) -> None:
        self._call(lambda: self._flow().set())

    @property
    def open_connections(self) -> int:
        return len(self._open) // 2

    # --- serving ---------------------------------------------------------------------------

    @contextmanager
    def serving(self) -> Iterator[FaultyProxy]:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="faulty-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise AssertionError("the proxy did not start")
        try:
            yield self
        finally:
            self._call(self._shutdown)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _call(self, fn: object) -> int:
        assert self._loop is not None and callable(fn)
        done: threading.Event = threading.Event()
        box: list[int] = []

        def call() -> None:
            try:
                box.append(int(fn() or 0))
            finally:
                done.set()

        self._loop.call_soon_threadsafe(call)
        done.wait(10)
        return box[0] if box else 0

    def _flow(self) -> asyncio.Event:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        return self._flowing

    def _cut_all(self) -> int:
        pairs = len(self._open) // 2
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()
        self.stats.cut += pairs
        return pairs

    def _shutdown(self) -> None:
        self._flow().set()
        self._cut_all()
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self._drop:
            self.stats.dropped += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer, writer),
            self._pipe(up_reader, writer, up_writer),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._open.discard(w)
            w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
    ) -> None:
        flowing = self._flow()
        try:
            while True:
                data = await reader.read(self.CHUNK)
                if not data:
                    break
                if self._delay_s:
                    await asyncio.sleep(self._delay_s)
                await flowing.wait()
                if writer.transport.is_closing():
                    break
                writer.write(data)
                self.stats.bytes += len(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                other.transport.abort()
                writer.transport.abort()
