"""SQL Server: no hand-written statements; the schedules' reads are ORM queries. (**Not run by
CI**: no SQL Server runs here, see docs/persistence.md.)"""

from __future__ import annotations

QUERIES: dict[str, str] = {}
