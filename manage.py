#!/usr/bin/env python3
"""Django's command-line utility for cleat."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A setting the environment got wrong (no SECRET_KEY with DEBUG off, a bad
        # CLEAT_* value): its reason, not a traceback through Django's start-up.
        sys.stderr.write(f"manage.py: configuration error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
