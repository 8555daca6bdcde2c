"""Django project wiring for cleat: settings, URLs, Celery app, WSGI/ASGI."""
