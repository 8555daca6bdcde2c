"""Row-level security for the schedules app's tables (see ``workflows/rls.py``)."""

from __future__ import annotations

SCHEDULE_TABLES = ("schedules_schedule",)
