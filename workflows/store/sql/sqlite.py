"""SQLite: no hand-written statements. The single writer lock of an IMMEDIATE transaction
serialises claims, and every other operation is said through the ORM."""

from __future__ import annotations

QUERIES: dict[str, str] = {}
