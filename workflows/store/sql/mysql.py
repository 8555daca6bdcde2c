"""MySQL / MariaDB: no hand-written statements in the store. Claims use the ORM's ``SELECT
... FOR UPDATE SKIP LOCKED`` then an ``UPDATE``; there is no row-level security, so every
query is scoped by tenant in the code."""

from __future__ import annotations

QUERIES: dict[str, str] = {}
