"""``manage.py ensure_admin``: make sure an operator can log in to the admin.

Creates the superuser ``admin`` when no superuser exists, with the password in
``CLEAT_ADMIN_PASSWORD`` (``python3 dev.py up`` keeps one in ``.env``) or a random one
printed once. Otherwise changes nothing, and says whether ``admin``'s password is still
``CLEAT_ADMIN_PASSWORD``'s.
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
        configured = os.environ.get("CLEAT_ADMIN_PASSWORD", "")
        if users.objects.filter(is_superuser=True).exists():
            admin = users.objects.filter(username="admin", is_superuser=True).first()
            if admin is None or not configured:
                self.stdout.write("a superuser exists; nothing to do")
            elif admin.check_password(configured):
                self.stdout.write("superuser 'admin' exists, with CLEAT_ADMIN_PASSWORD's password")
            else:
                self.stdout.write(
                    "superuser 'admin' exists, but its password is no longer "
                    "CLEAT_ADMIN_PASSWORD's (change it with `manage.py changepassword admin`)"
                )
            return
        password = configured or secrets.token_urlsafe(12)
        users.objects.create_superuser("admin", "admin@localhost", password)
        shown = "from CLEAT_ADMIN_PASSWORD" if configured else password
        self.stdout.write(self.style.SUCCESS(f"created superuser 'admin' (password: {shown})"))
