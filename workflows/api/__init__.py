"""The REST API for clients (``/api/v1/``): Django REST framework viewsets over
``workflows.services`` and ``workflows.definitions``, API keys scoped to one tenant, the
OpenAPI schema (drf-spectacular), ``/healthz`` and ``/metrics``. See docs/api.md."""
