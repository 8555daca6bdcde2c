"""Text no database can store or no page render: a lone UTF-16 surrogate (spelled as a JSON
escape, ``"\\ud800"``) or a raw U+0000 in what the guest hands the host to keep. The host
refuses it as ``guest_fault`` naming the function; a valid surrogate pair passes."""

from __future__ import annotations

import json

import pytest

from engine import storable
from engine.testing import WorkflowEnvironment
from tests.fixtures.wat import Wat

LONE = '"\\ud800"'  # JSON text: a string holding one high surrogate
PAIR = '"\\ud83d\\ude00"'  # JSON text: a valid pair (U+1F600)


def _returns(text: str) -> bytes:
    w = Wat()
    w.run(w.reply(0, text))
    return w.wasm()


def _publishes(key: str, value: str) -> bytes:
    w = Wat()
    w.run(f"(drop (call $set_query_state {w.s(key)} {w.s(value)}))\n{w.reply(0, 'null')}")
    return w.wasm()


def _run(wasm: bytes) -> dict[str, object]:
    env = WorkflowEnvironment()
    env.deploy("w", wasm)
    return env.describe(env.run("w"))


def test_a_result_with_a_lone_surrogate_is_a_guest_fault() -> None:
    run = _run(_returns(f'{{"name":{LONE}}}'))
    assert run["status"] == "failed", run
    assert run["error_code"] == "guest_fault"
    assert "result contains a lone UTF-16 surrogate at $.name" in str(run["error"])


def test_a_result_with_a_surrogate_pair_or_an_escaped_backslash_completes() -> None:
    for text in (PAIR, '"\\\\ud800"', '"\\u0000"'):
        run = _run(_returns(text))
        assert run["status"] == "done", (text, run)
        assert run["result"] == text


def test_a_result_with_a_raw_nul_is_a_guest_fault() -> None:
    run = _run(_returns("not json \x00 at all"))
    assert run["error_code"] == "guest_fault", run
    assert "NUL character" in str(run["error"])


@pytest.mark.parametrize(
    ("key", "value", "fault"),
    [
        ("stage", LONE, "set_query_state: the value contains a lone UTF-16 surrogate"),
        ("st\x00age", '"ok"', "set_query_state: the key contains a NUL character"),
    ],
)
def test_unstorable_query_state_is_a_guest_fault(key: str, value: str, fault: str) -> None:
    run = _run(_publishes(key, value))
    assert run["error_code"] == "guest_fault", run
    assert fault in str(run["error"])


def test_json_parse_of_a_lone_surrogate_is_refused_not_a_host_error() -> None:
    w = Wat()
    w.run(f"(call $rec (call $json_parse {w.s(LONE)}))\n(call $finish)")
    run = _run(w.wasm())
    assert run["status"] == "done", run
    [[status, message]] = json.loads(str(run["result"]))
    assert status == 2 and "lone UTF-16 surrogate" in message, (status, message)


def test_the_rule_itself() -> None:
    assert storable.json_text_fault(LONE) is not None
    assert storable.json_text_fault('{"a":[1,"\\uDC00"]}') == (
        "contains a lone UTF-16 surrogate at $.a[1], which is not valid Unicode text"
    )
    assert storable.json_text_fault(PAIR) is None
    assert storable.json_text_fault('"\\\\ud800"') is None  # a backslash, then "ud800"
    assert storable.json_text_fault("not JSON \\ud800") is None  # plain text, no surrogate
    assert storable.value_fault({"\ud800": 1}) is not None
    assert storable.readable({"k\udc00": ["a\ud800"]}) == {"k\ufffd": ["a\ufffd"]}
    assert storable.parse_readable(LONE) == "\ufffd"


def test_an_error_message_with_a_raw_nul_is_kept_readable() -> None:
    """The run fails as the guest said; its message loses only the character no PostgreSQL
    text column takes."""
    w = Wat()
    w.run(w.reply(2, "bad\x00thing"))
    run = _run(w.wasm())
    assert (run["status"], run["error_code"]) == ("failed", "permanent"), run
    assert run["error"] == "bad\ufffdthing"


@pytest.mark.parametrize(
    ("call", "fault"),
    [
        ("(drop (call $set_state {ok} {v}))", "set_state: the value contains a NUL character"),
        ("(drop (call $create_promise {k}))", "create_promise: the name contains a NUL"),
        (
            "(drop (call $signal_workflow {v} {k} {j}))",
            "signal_workflow: the name contains a NUL",
        ),
    ],
)
def test_names_and_state_with_a_raw_nul_are_a_guest_fault(call: str, fault: str) -> None:
    w = Wat()
    body = call.format(k=w.s("na\x00me"), v=w.s("va\x00lue"), j=w.s("null"), ok=w.s("key"))
    w.run(f"{body}\n{w.reply(0, 'null')}")
    run = _run(w.wasm())
    assert run["error_code"] == "guest_fault", run
    assert fault in str(run["error"])
