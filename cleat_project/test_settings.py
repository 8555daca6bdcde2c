"""Settings for the test suite: the normal settings with DEBUG defaults suited to tests."""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")

from cleat_project.settings import *  # noqa: F403
