"""ASGI entry point."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")
application = get_asgi_application()

from workflows.apps import refuse_bad_configuration  # noqa: E402 -- needs the apps loaded

refuse_bad_configuration()
