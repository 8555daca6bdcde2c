"""MySQL / MariaDB: no hand-written statements; the schedules' reads are ORM queries (there is no
row-level security to step around)."""

from __future__ import annotations

QUERIES: dict[str, str] = {}
