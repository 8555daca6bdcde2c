"""The schedules' routes of the REST API, under ``/api/v1/`` (``cleat_project/urls.py``
composes them with the workflows' routes). No trailing slashes, as everywhere in the API."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from schedules.api.views import ScheduleViewSet

router = SimpleRouter(trailing_slash=False)
router.register("schedules", ScheduleViewSet, basename="schedule")

urlpatterns = router.urls
