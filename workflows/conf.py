"""cleat's settings, gathered from ``CLEAT_*`` Django settings into one typed object."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from engine.config import EngineConfig
from engine.services import Services


@dataclass(frozen=True)
class CleatSettings:
    engine: EngineConfig
    services: dict[str, Any]
    ambiguity_resolvers: dict[str, Any]
    fetch_allow: tuple[str, ...]
    fetch_allow_private: bool
    plugins: dict[str, Any]
    plugin_guard: dict[str, Any]
    plugin_cooldown_s: float

    def build_services(self) -> Services:
        return Services.from_settings(
            self.services,
            fetch_allow=self.fetch_allow,
            fetch_allow_private=self.fetch_allow_private,
            plugins=self.plugins,
            resolvers=self.ambiguity_resolvers,
            plugin_guard=self.plugin_guard,
            plugin_cooldown_s=self.plugin_cooldown_s,
        )


def _mapping(name: str) -> dict[str, Any]:
    value = getattr(settings, name, {}) or {}
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object mapping names to targets")
    return dict(value)


@cache
def cleat_settings() -> CleatSettings:
    """Read and validate the settings once; a bad value stops start-up with its name."""
    cache_dir = getattr(settings, "CLEAT_MODULE_CACHE_DIR", "") or None
    try:
        engine = EngineConfig(
            memory_limit_bytes=settings.CLEAT_MEMORY_LIMIT_BYTES,
            max_string_bytes=settings.CLEAT_MAX_STRING_BYTES,
            segment_timeout_s=settings.CLEAT_SEGMENT_TIMEOUT_SECONDS,
            fuel=settings.CLEAT_FUEL,
            max_instances=settings.CLEAT_MAX_INSTANCES,
            max_table_elements=settings.CLEAT_MAX_TABLE_ELEMENTS,
            max_history_events=settings.CLEAT_MAX_HISTORY_EVENTS,
            module_cache_size=settings.CLEAT_MODULE_CACHE_SIZE,
            module_cache_dir=Path(cache_dir) if cache_dir else None,
            module_cache_max_bytes=int(getattr(settings, "CLEAT_MODULE_CACHE_MAX_MB", 4096))
            * 1024
            * 1024,
            write_ahead_ops=frozenset(settings.CLEAT_WRITE_AHEAD_OPS),
        )
    except ValueError as exc:
        raise ImproperlyConfigured(f"CLEAT_* settings: {exc}") from None
    return CleatSettings(
        engine=engine,
        services=_mapping("CLEAT_SERVICES"),
        ambiguity_resolvers=_mapping("CLEAT_AMBIGUITY_RESOLVERS"),
        fetch_allow=tuple(settings.CLEAT_FETCH_ALLOW),
        fetch_allow_private=bool(settings.CLEAT_FETCH_ALLOW_PRIVATE),
        plugins=_mapping("CLEAT_PLUGINS"),
        plugin_guard=_mapping("CLEAT_PLUGIN_GUARD"),
        plugin_cooldown_s=float(getattr(settings, "CLEAT_PLUGIN_COOLDOWN_SECONDS", 60.0)),
    )
