"""The envelope of encryption at rest (workflows/crypto.py): round trip, the associated data
binding a ciphertext to its tenant, row and column, tampering, and the key configuration."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from workflows import crypto

K1 = base64.b64encode(os.urandom(32)).decode()
K2 = base64.b64encode(os.urandom(32)).decode()
CONTEXT = {"tenant": "t-1", "owner": "run-1", "kind": "workflows.workflowinstance.input"}


def ring(current: str = "", **keys: str) -> override_settings:
    return override_settings(
        CLEAT_ENCRYPTION_KEYS=json.dumps(keys), CLEAT_ENCRYPTION_KEY_ID=current
    )


def test_a_sealed_value_names_its_key_and_opens_to_the_plaintext() -> None:
    with ring(k1=K1):
        sealed = crypto.seal('{"card":"4111"}', **CONTEXT)
        assert sealed is not None and sealed.startswith("cleat:enc:v1:k1:")
        assert "4111" not in sealed
        assert crypto.key_id_of(sealed) == "k1"
        assert crypto.open_text(sealed, **CONTEXT) == '{"card":"4111"}'
        # A fresh nonce each time: the same plaintext never seals the same way twice.
        assert crypto.seal('{"card":"4111"}', **CONTEXT) != sealed
        assert (
            crypto.seal("", **CONTEXT) != ""
            and crypto.open_text(crypto.seal("", **CONTEXT), **CONTEXT) == ""
        )
        assert crypto.seal(None, **CONTEXT) is None


def test_plaintext_rows_stay_readable_and_nothing_is_sealed_without_keys() -> None:
    with ring(k1=K1):
        assert crypto.open_text('{"old":1}', **CONTEXT) == '{"old":1}'
    with override_settings(CLEAT_ENCRYPTION_KEYS="", CLEAT_ENCRYPTION_KEY_ID=""):
        assert crypto.seal("x", **CONTEXT) == "x"


@pytest.mark.parametrize(
    "other",
    [
        {**CONTEXT, "tenant": "t-2"},
        {**CONTEXT, "owner": "run-2"},
        {**CONTEXT, "kind": "workflows.workflowinstance.result"},
    ],
)
def test_a_ciphertext_does_not_open_in_another_tenant_row_or_column(other: dict[str, str]) -> None:
    with ring(k1=K1):
        sealed = crypto.seal("secret", **CONTEXT)
        with pytest.raises(crypto.EncryptionKeyMissing, match="'k1'") as refused:
            crypto.open_text(sealed, **other)
        assert refused.value.key_id == "k1"


def test_an_altered_ciphertext_or_a_relabelled_key_id_does_not_open() -> None:
    with ring("k1", k1=K1, k2=K2):
        sealed = crypto.seal("secret", **CONTEXT)
        assert sealed is not None
        body = sealed.rsplit(":", 1)[1]
        flipped = body[:10] + ("A" if body[10] != "A" else "B") + body[11:]
        with pytest.raises(crypto.EncryptionKeyMissing):
            crypto.open_text(sealed.replace(body, flipped), **CONTEXT)
        with pytest.raises(crypto.EncryptionKeyMissing, match="'k2'"):
            crypto.open_text(sealed.replace(":k1:", ":k2:"), **CONTEXT)
        with pytest.raises(crypto.EncryptionKeyMissing, match="'k1'"):
            crypto.open_text(sealed[:-8], **CONTEXT)


def test_a_missing_key_names_its_id() -> None:
    with ring(k1=K1):
        sealed = crypto.seal("secret", **CONTEXT)
    with ring(k2=K2), pytest.raises(crypto.EncryptionKeyMissing, match="'k1' is not configured"):
        crypto.open_text(sealed, **CONTEXT)


def test_json_values_round_trip_as_a_sealed_json_string() -> None:
    with ring(k1=K1):
        sealed = crypto.seal_json({"q": '{"a":1}'}, **CONTEXT)
        assert isinstance(sealed, str) and crypto.is_sealed(sealed)
        assert crypto.open_json(sealed, **CONTEXT) == {"q": '{"a":1}'}
        assert crypto.open_json({"plain": "1"}, **CONTEXT) == {"plain": "1"}


@pytest.mark.parametrize(
    ("keys", "current", "reason"),
    [
        ("{not json", "", "is not JSON"),
        ('{"k1": "***"}', "", "'k1' is not valid base64"),
        (json.dumps({"k1": base64.b64encode(b"x" * 16).decode()}), "", "16 bytes, not 32"),
        (json.dumps({"k1": K1}), "k2", "'k2' is not in CLEAT_ENCRYPTION_KEYS"),
        (json.dumps({"k1": K1, "k2": K2}), "", "must name the current key"),
        (json.dumps({"a:b": K1}), "", "without ':'"),
        ("", "k1", "CLEAT_ENCRYPTION_KEYS is empty"),
    ],
)
def test_a_bad_configuration_is_refused_with_its_reason(
    keys: str, current: str, reason: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=reason):
        crypto.parse_keyring(keys, current)


def test_one_key_needs_no_current_id_and_several_take_the_named_one() -> None:
    one = crypto.parse_keyring(json.dumps({"only": K1}), "")
    assert one is not None and one.current == "only"
    several = crypto.parse_keyring({"k1": K1, "k2": K2}, "k2")
    assert several is not None and several.current == "k2" and set(several.keys) == {"k1", "k2"}
    assert crypto.parse_keyring("", "") is None


def test_the_key_generation_command_in_the_docs_makes_a_valid_key() -> None:
    """docs/operations.md, "Encryption at rest": the command that makes a key."""
    import subprocess
    import sys
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    command = 'python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"'
    assert command in docs
    code = command.split('"')[1]
    made = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    parsed = crypto.parse_keyring(json.dumps({"2026-12": made}), "2026-12")
    assert parsed is not None and parsed.current == "2026-12"


def test_the_keys_can_come_from_a_credential_provider(tmp_path: Path) -> None:
    """``CLEAT_ENCRYPTION_KEYS`` may name where the JSON is (workflows.secrets), e.g. a
    mounted file; one that cannot be read is refused naming the provider."""
    from workflows import secrets

    mounted = tmp_path / "keys.json"
    mounted.write_text(json.dumps({"k1": K1, "k2": K2}) + "\n")
    secrets.invalidate()
    with override_settings(CLEAT_ENCRYPTION_KEYS=f"file:{mounted}", CLEAT_ENCRYPTION_KEY_ID="k2"):
        ring = crypto.keyring()
        assert ring is not None and ring.current == "k2" and set(ring.keys) == {"k1", "k2"}
    secrets.invalidate()
    absent = override_settings(
        CLEAT_ENCRYPTION_KEYS=f"file:{tmp_path}/absent", CLEAT_ENCRYPTION_KEY_ID=""
    )
    refused = pytest.raises(ImproperlyConfigured, match=r"CLEAT_ENCRYPTION_KEYS: file:.*absent")
    with absent, refused:
        crypto.keyring()
    crypto.reset()
