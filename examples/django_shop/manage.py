#!/usr/bin/env python
"""The example shop's manage.py: an ordinary Django project with cleat's app installed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# This example lives inside the cleat checkout: put the checkout (the ``workflows`` app and
# ``engine``) and the Python SDK (``cleat_workflow``, for building) on the path. A project
# of your own puts them there the same way, or with PYTHONPATH.
CLEAT = Path(os.environ.get("CLEAT_HOME", HERE.parents[1]))
for path in (HERE, CLEAT, CLEAT / "sdk" / "python"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
