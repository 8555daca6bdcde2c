"""Fixtures of the Python SDK tests: the guest apps built once per content hash.

A build runs componentize-py (about a minute) only when the app, the SDK, the WIT world
or componentize-py changed; compiled components are cached on disk too
(``cleat_workflow.testing``), so a warm run of these tests takes seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SDK_PYTHON = ROOT / "sdk" / "python"
if str(SDK_PYTHON) not in sys.path:
    sys.path.insert(0, str(SDK_PYTHON))

APPS = Path(__file__).resolve().parent / "apps"
SCENARIOS = APPS / "scenarios.py"
SCENARIOS_CHANGED = APPS / "scenarios_changed.py"


@pytest.fixture(scope="session")
def scenarios_wasm() -> bytes:
    from cleat_workflow.testing import build

    return build(SCENARIOS)


@pytest.fixture(scope="session")
def scenarios_changed_wasm() -> bytes:
    from cleat_workflow.testing import build

    return build(SCENARIOS_CHANGED)
