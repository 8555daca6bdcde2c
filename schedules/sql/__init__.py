"""The schedules app's hand-written SQL, one module per dialect, fetched by name:
``queries(connection)["due_schedules"]`` (the same shape as ``workflows/store/sql/``; it lives
here because workflows must not know the schedules' tables). A name a dialect does not
define means the store says it through the ORM there.
"""

from __future__ import annotations

from workflows.store.sql import loader

queries = loader(__name__)

__all__ = ["queries"]
