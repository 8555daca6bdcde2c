"""The schedules' part of the REST API (``/api/v1/schedules``), composed with the workflows'
routes in ``cleat_project/urls.py``."""
