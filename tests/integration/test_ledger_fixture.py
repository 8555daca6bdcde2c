"""The fault scenarios' ledger (``support.ledger``) is the judge of "every effect once": it
must act like a real idempotent service, or the checker blames the engine for the fixture.

A worker killed at a crash point while another of its threads is sending a call leaves the
ledger only the request's headers (http.client writes the headers and the body separately).
The ledger once read the missing body as ``null`` and performed the effect; the call, made
again after the crash with its real body and the same key, was then refused as a reused
key -- a failure of the fault test that was the fixture's, not the engine's."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request

from tests.integration.support.ledger import Ledger


def post(url: str, operation: str, key: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        urllib.parse.urljoin(url, operation),
        data=body,
        method="POST",
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_request_cut_off_after_its_headers_is_not_acted_on() -> None:
    with Ledger().serving() as ledger:
        address = urllib.parse.urlsplit(ledger.url)
        with socket.create_connection((address.hostname, address.port), timeout=10) as cut:
            cut.sendall(
                b"POST /leaf HTTP/1.1\r\nHost: ledger\r\nIdempotency-Key: k1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n"
            )
        deadline = time.monotonic() + 10
        while ledger.truncated == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ledger.truncated == 1
        assert ledger.entries == {}
        # The same call made whole, as after the crash: performed once, nothing refused.
        status, text = post(ledger.url, "leaf", "k1", b'{"n":0}')
        assert status == 200
        assert json.loads(text) == {"op": "leaf", "seq": 1, "request": {"n": 0}}
        assert post(ledger.url, "leaf", "k1", b'{"n":0}') == (200, text)
        assert ledger.mismatches == []
        # A key reused for another request is still refused.
        assert post(ledger.url, "leaf", "k1", b'{"n":1}')[0] == 422
        assert ledger.mismatches == ["k1"]
