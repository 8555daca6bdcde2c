"""MySQL / MariaDB: almost no hand-written statements in the store. Claims use the ORM's
``SELECT ... FOR UPDATE SKIP LOCKED`` then an ``UPDATE``; there is no row-level security, so
every query is scoped by tenant in the code. The one statement here reads the server's clock
(the fleet's common time, see workflows/worker.py), in UTC, naive."""

from __future__ import annotations

QUERIES: dict[str, str] = {
    "database_now": "SELECT UTC_TIMESTAMP(6)",
}
