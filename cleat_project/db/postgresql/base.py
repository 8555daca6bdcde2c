"""PostgreSQL, with the password from a credential provider (``cleat_project.db``)."""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from cleat_project.db import connect_reading_again, password_params


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        return password_params(super().get_connection_params(), self.settings_dict)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        parent = super().get_new_connection
        return connect_reading_again(parent, conn_params, self.settings_dict)
