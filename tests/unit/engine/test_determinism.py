"""Idempotency keys and the replay-stable sources of ids and randomness."""

from __future__ import annotations

import pytest

from engine.determinism import derived_uuid, idempotency_key, random_i64, run_seed

# Computed independently with coreutils:
#   printf '%s\0%s\0%s' WF RUN STEP | sha256sum | xxd -r -p | base32 | tr -d = | tr A-Z a-z
VECTORS = [
    ("wf-1", "run-1", 0, "5twtyepyjorvsplutrboi7oybmy7g3sfi4fxplnvchxbofyy7luq"),
    ("wf-1", "run-1", 7, "eemwecgp7ntay77jubglv53m5am5fu356psixcvsxlzdc255v7ba"),
    ("ab", "c", 1, "ppanprb7amoronlrkfxm5nlpay4gq3ycfeaqmoykbjunfaen6qvq"),
    ("a", "bc", 1, "75x3xm5br3blm6hlgmufrxyx6lu5luhjplhjt4gnz3i4ecl63c2q"),
    ("order-42", "3f2a9c", 12345, "yh7eqsw7zsk7gs7tjah67lfd2cfnlfwvq3ne6u5it5a7p2hnndyq"),
]


@pytest.mark.parametrize(("workflow_id", "run_id", "step", "expected"), VECTORS)
def test_idempotency_key_matches_the_reference_formula(workflow_id, run_id, step, expected):
    assert idempotency_key(workflow_id, run_id, step) == expected


def test_separators_keep_concatenations_apart():
    assert idempotency_key("ab", "c", 1) != idempotency_key("a", "bc", 1)


def test_derived_uuid_is_stable_and_version_4():
    first = derived_uuid("wf", "run", 3, "seed")
    assert first == derived_uuid("wf", "run", 3, "seed")
    assert first != derived_uuid("wf", "run", 4, "seed")
    assert first[14] == "4"


def test_random_stream_is_a_function_of_the_run_and_position():
    seed = run_seed("wf", "run")
    values = [random_i64(seed, i) for i in range(5)]
    assert values == [random_i64(seed, i) for i in range(5)]
    assert len(set(values)) == 5
    assert values != [random_i64(run_seed("wf", "other"), i) for i in range(5)]
    assert all(-(2**63) <= v < 2**63 for v in values)
