"""``manage.py ensure_admin``: make sure an operator can log in to the admin.

Creates the superuser ``admin`` when no superuser exists, with the password in
``CLEAT_ADMIN_PASSWORD`` or a random one printed once. Does nothing otherwise.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the 'admin' superuser if there is no superuser yet."

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("a superuser exists; nothing to do")
            return
        password = os.environ.get("CLEAT_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        users.objects.create_superuser("admin", "admin@localhost", password)
        shown = "from CLEAT_ADMIN_PASSWORD" if os.environ.get("CLEAT_ADMIN_PASSWORD") else password
        self.stdout.write(self.style.SUCCESS(f"created superuser 'admin' (password: {shown})"))
