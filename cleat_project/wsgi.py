"""WSGI entry point."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")
application = get_wsgi_application()

from workflows.apps import refuse_bad_configuration  # noqa: E402 -- needs the apps loaded

refuse_bad_configuration()
