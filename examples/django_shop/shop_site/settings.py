"""Settings of an existing Django project (a small shop) that added cleat.

The cleat part is marked; everything else is what ``django-admin startproject`` writes.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "django-shop-example-insecure-key")
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # --- cleat: the workflow engine's app (models, store, worker, console) ---
    "workflows",
    # --- the project's own apps ---
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # --- cleat: runs each /admin/ request in its tenant's context (the console) ---
    "workflows.middleware.TenantContextMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shop_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "shop.sqlite3")),
        # A file for the test database too: the worker's threads share it.
        "TEST": {"NAME": os.environ.get("SHOP_TEST_DB", str(BASE_DIR / "test-shop.sqlite3"))},
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# --- cleat ---------------------------------------------------------------------------------
# The services workflows call, by name: Python modules of this project (they may use the
# ORM: the worker runs inside the project) or HTTP base URLs. Every other CLEAT_* setting
# has its default (docs/embedding.md lists the ones worth setting).
CLEAT_SERVICES = {
    "inventory": "shop.services.inventory",
    "payments": "shop.services.payments",
}
# Where the worker keeps compiled workflows between restarts.
CLEAT_MODULE_CACHE_DIR = os.environ.get(
    "CLEAT_MODULE_CACHE_DIR", str(Path.home() / ".cache" / "cleat" / "modules")
)
