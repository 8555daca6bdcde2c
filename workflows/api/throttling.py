"""Per-key rate limiting: each API key (or staff user) has its own budget, whichever
process or tenant it calls; the rate is ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["api_key"]``
(``CLEAT_API_RATE``, e.g. ``1200/min``; empty disables it). Counts live in Django's cache:
configure a shared cache (Redis, database) when several web processes serve the API."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from workflows.api.authentication import ApiIdentity


class ApiKeyRateThrottle(SimpleRateThrottle):
    scope = "api_key"

    def get_rate(self) -> str | None:
        # Read at request time (not import time) so that a settings change applies.
        rates: dict[str, str | None] = api_settings.DEFAULT_THROTTLE_RATES or {}
        return rates.get(self.scope) or None

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        identity = request.auth
        if isinstance(identity, ApiIdentity):
            if identity.key_id is not None:
                ident = f"key-{identity.key_id}"
            else:
                ident = f"user-{getattr(request.user, 'pk', '?')}"
        else:
            ident = f"addr-{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
