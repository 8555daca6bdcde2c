"""cleat's settings, gathered from ``CLEAT_*`` Django settings into one typed object."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django import db
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from engine.compaction import DEFAULT_THRESHOLD as DEFAULT_COMPACTION_THRESHOLD
from engine.config import MIB, EngineConfig
from engine.services import Services
from workflows import tracing


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
    service_tokens: dict[str, str]

    def build_services(self) -> Services:
        from workflows import secrets

        tokens = {
            name: functools.partial(secrets.resolve, spec)
            for name, spec in self.service_tokens.items()
        }
        services = Services.from_settings(
            self.services,
            fetch_allow=self.fetch_allow,
            fetch_allow_private=self.fetch_allow_private,
            plugins=self.plugins,
            resolvers=self.ambiguity_resolvers,
            plugin_guard=self.plugin_guard,
            plugin_cooldown_s=self.plugin_cooldown_s,
            service_tokens=tokens,
            tracer=tracing.tracer(),
        )
        # A batched call runs on a thread of its own: a service that used the ORM there
        # opened that thread's connection, which must not outlive the call.
        services.after_batch_call = db.connections.close_all
        return services


def _mapping(name: str) -> dict[str, Any]:
    value = getattr(settings, name, {}) or {}
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object mapping names to targets")
    return dict(value)


def compact_after_events() -> int:
    """``CLEAT_COMPACT_AFTER_EVENTS`` (engine/compaction.py): fold a run's history once this
    many of its events are rows; 0: off. Read at each use (tests override it); checked at
    start-up by :func:`cleat_settings`."""
    value = getattr(settings, "CLEAT_COMPACT_AFTER_EVENTS", DEFAULT_COMPACTION_THRESHOLD)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(
            f"CLEAT_COMPACT_AFTER_EVENTS must be a whole number >= 0 (0: off), not {value!r}"
        )
    return value


@cache
def cleat_settings() -> CleatSettings:
    """Read and validate the settings once; a bad value stops start-up with its name."""
    # Every knob has the engine's default (``EngineConfig``), so a project that embeds the
    # app sets only the ones it changes (docs/embedding.md).
    defaults = EngineConfig()
    compact_after_events()
    cache_dir = getattr(settings, "CLEAT_MODULE_CACHE_DIR", "") or None

    def knob(name: str, default: Any) -> Any:
        return getattr(settings, name, default)

    try:
        engine = EngineConfig(
            memory_limit_bytes=knob("CLEAT_MEMORY_LIMIT_BYTES", defaults.memory_limit_bytes),
            max_string_bytes=knob("CLEAT_MAX_STRING_BYTES", defaults.max_string_bytes),
            segment_timeout_s=knob("CLEAT_SEGMENT_TIMEOUT_SECONDS", defaults.segment_timeout_s),
            fuel=knob("CLEAT_FUEL", defaults.fuel),
            max_instances=knob("CLEAT_MAX_INSTANCES", defaults.max_instances),
            max_table_elements=knob("CLEAT_MAX_TABLE_ELEMENTS", defaults.max_table_elements),
            max_history_events=knob("CLEAT_MAX_HISTORY_EVENTS", defaults.max_history_events),
            module_cache_size=knob("CLEAT_MODULE_CACHE_SIZE", defaults.module_cache_size),
            module_cache_dir=Path(cache_dir) if cache_dir else None,
            module_cache_max_bytes=int(
                knob("CLEAT_MODULE_CACHE_MAX_MB", defaults.module_cache_max_bytes // MIB)
            )
            * MIB,
            write_ahead_ops=frozenset(knob("CLEAT_WRITE_AHEAD_OPS", ())),
            max_parallel_calls=knob("CLEAT_MAX_PARALLEL_CALLS", defaults.max_parallel_calls),
            ready_instances=knob("CLEAT_READY_INSTANCES", defaults.ready_instances),
            warm_pages=bool(knob("CLEAT_WARM_PAGES", defaults.warm_pages)),
        )
    except ValueError as exc:
        raise ImproperlyConfigured(f"CLEAT_* settings: {exc}") from None
    return CleatSettings(
        engine=engine,
        services=_mapping("CLEAT_SERVICES"),
        ambiguity_resolvers=_mapping("CLEAT_AMBIGUITY_RESOLVERS"),
        fetch_allow=tuple(getattr(settings, "CLEAT_FETCH_ALLOW", ())),
        fetch_allow_private=bool(getattr(settings, "CLEAT_FETCH_ALLOW_PRIVATE", False)),
        plugins=_mapping("CLEAT_PLUGINS"),
        plugin_guard=_mapping("CLEAT_PLUGIN_GUARD"),
        plugin_cooldown_s=float(getattr(settings, "CLEAT_PLUGIN_COOLDOWN_SECONDS", 60.0)),
        service_tokens=_mapping("CLEAT_SERVICE_TOKENS"),
    )
