"""The SDK's pure parts, on the host: status codes, exceptions, the registry, durations."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cleat_workflow import (
    Ambiguous,
    CallFailed,
    Cancelled,
    ChildResult,
    Denied,
    NotFound,
    PermanentError,
    RetriesExhausted,
    Timeout,
    _errors,
    _registry,
    error_for,
    handler,
    workflow,
)
from cleat_workflow._context import _ms

from engine.status import AbiStatus


def test_status_codes_are_the_abi_ones() -> None:
    for status in AbiStatus:
        assert getattr(_errors, status.name) == status.value
        assert _errors.STATUS_LABELS[status.value] == status.label


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (AbiStatus.ERROR, CallFailed),
        (AbiStatus.PERMANENT, PermanentError),
        (AbiStatus.AMBIGUOUS, Ambiguous),
        (AbiStatus.TIMEOUT, Timeout),
        (AbiStatus.CANCELLED, Cancelled),
        (AbiStatus.RETRIES_EXHAUSTED, RetriesExhausted),
        (AbiStatus.NOT_FOUND, NotFound),
        (AbiStatus.DENIED, Denied),
        (99, CallFailed),
    ],
)
def test_each_status_has_its_exception(status: int, cls: type[Exception]) -> None:
    error = error_for(status, "why")
    assert type(error) is cls
    assert error.message == "why"
    if status != 99:
        assert error.status == status


def test_retries_exhausted_is_a_call_failure() -> None:
    assert issubclass(RetriesExhausted, CallFailed)


def test_a_child_result_raises_its_failure() -> None:
    ok = ChildResult.from_json({"run_id": "r1", "status": "ok", "result": {"n": 2}})
    assert ok.ok and ok.value() == {"n": 2}
    failed = ChildResult.from_json({"run_id": "r2", "status": "permanent", "error": "no"})
    with pytest.raises(PermanentError, match="no"):
        failed.value()


def test_durations_are_whole_milliseconds() -> None:
    assert _ms(1.5) == 1500
    assert _ms(timedelta(minutes=2)) == 120_000
    assert _ms(None) == -1
    with pytest.raises(ValueError, match="negative"):
        _ms(-1)


def test_the_registry_refuses_two_workflows_of_one_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry, "workflows", {})
    monkeypatch.setattr(_registry, "handlers", {})

    @workflow
    def order(ctx: object, input: object) -> None: ...

    @workflow(name="order_v2")
    def order2(ctx: object, input: object) -> None: ...

    @handler
    def cleanup(ctx: object, input: object) -> None: ...

    assert _registry.entry_names() == ["order", "order_v2"]
    assert _registry.resolve_entry("order_v2") is order2
    assert cleanup.__cleat_handler__ == "cleanup"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="two workflows are named 'order'"):

        @workflow(name="order")
        def other(ctx: object, input: object) -> None: ...


def test_plugin_stream_wraps_plugin_call_streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ctx.plugin_stream`` calls the streaming import and answers its chunks as values; a
    refusal raises the status's exception, as every call does."""
    from cleat_workflow import Context, _host

    seen: list[tuple[str, str, str]] = []

    class Host:
        def plugin_call_streaming(self, plugin: str, function: str, input: str) -> str:
            seen.append((plugin, function, input))
            return '[{"t":"he"},{"t":"llo"}]'

    monkeypatch.setattr(_host, "host", Host())
    ctx = Context("run")
    assert ctx.plugin_stream("llm", "complete", {"prompt": "hi"}) == [{"t": "he"}, {"t": "llo"}]
    assert seen == [("llm", "complete", '{"prompt":"hi"}')]

    class Err(Exception):
        def __init__(self, status: int, message: str) -> None:
            self.value = type("V", (), {"status": status, "message": message})()

    class DenyingHost:
        def plugin_call_streaming(self, plugin: str, function: str, input: str) -> str:
            raise Err(AbiStatus.DENIED, "plugin 'llm' may not be called by workflow 'x'")

    monkeypatch.setattr(_host, "host", DenyingHost())
    monkeypatch.setattr(_host, "Err", Err)
    with pytest.raises(Exception, match="may not be called") as caught:
        ctx.plugin_stream("llm", "complete")
    assert type(caught.value).__name__ == "Denied"
