"""The publisher the dispatch tests give cleat (``CLEAT_CELERY_APP``): :data:`RECORDER`
keeps every message instead of sending it (in-process tests); :data:`BROKER` sends with a
Celery app the test points at a real broker (``BROKER.use(url)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

RECORDER_PATH = "tests.integration.support.dispatch.RECORDER"
BROKER_PATH = "tests.integration.support.dispatch.BROKER"


@dataclass
class Sent:
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]


@dataclass
class Recorder:
    """A stand-in for a Celery app: ``send_task`` records; ``fail`` makes it raise (a broker
    away)."""

    broker_url: str = "amqp://recorder//"
    sent: list[Sent] = field(default_factory=list)
    fail: bool = False
    depth: int = 0  # the messages every queue holds, as the broker would answer

    def connection_for_write(self) -> Any:
        recorder = self

        class _Channel:
            def queue_declare(self, queue: str, passive: bool = False) -> tuple[str, int, int]:
                assert passive, "the sweep only asks"
                return queue, recorder.depth, 0

        class _Connection:
            default_channel = _Channel()

            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: Any) -> None:
                return None

        return _Connection()

    @property
    def conf(self) -> Any:
        return SimpleNamespace(broker_url=self.broker_url)

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        if self.fail:
            raise ConnectionError("the broker is away")
        self.sent.append(Sent(name, list(args or []), dict(kwargs or {}), options))

    def runs(self) -> list[str]:
        return [m.args[1] for m in self.sent]

    def clear(self) -> None:
        self.sent.clear()
        self.fail = False
        self.depth = 0


RECORDER = Recorder()


class BrokerPublisher:
    """This project's Celery app, on the broker of the test's choosing (a fresh app per
    broker: an app keeps its connection pool once it published)."""

    def __init__(self) -> None:
        self._apps: dict[str, Any] = {}
        self.url = ""

    def use(self, url: str) -> None:
        self.url = url

    def _app(self) -> Any:
        from celery import Celery

        from cleat_project.celery import CleatQueues

        found = self._apps.get(self.url)
        if found is None:
            found = Celery("cleat-test-publisher", broker=self.url, set_as_current=False)
            found.amqp.queues_cls = CleatQueues
            self._apps[self.url] = found
        return found

    @property
    def conf(self) -> Any:
        return self._app().conf

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._app().send_task(name, *args, **kwargs)

    def close(self) -> None:
        for app in self._apps.values():
            app.close()
        self._apps.clear()


BROKER = BrokerPublisher()
