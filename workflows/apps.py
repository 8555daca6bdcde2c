from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps import AppConfig
from django.core import checks


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from workflows import celery_calls, dispatch, duties, faults, retention, version_duty
        from workflows.maintenance import reaper_duty, wake_sweep_duty
        from workflows.store import timestamps

        timestamps.install()  # PostgreSQL timestamps parsed in C (store/timestamps.py)

        for check in CONFIGURATION_CHECKS:
            checks.register(check, CHECK_TAG)
        celery_calls.register()
        # First, so a pass of the loop reaps before the apps' duties (and the claim) run.
        duties.register("reaper", reaper_duty)
        duties.register("wake_sweep", wake_sweep_duty)
        duties.register("retention", retention.worker_duty)
        duties.register("versions", version_duty.worker_duty)
        # Broker dispatch: publish what became due without a wake-up, and lost messages.
        duties.register("dispatch_sweep", dispatch.sweep_duty)
        # Test-only fault injection; both settings are empty in production (nothing happens).
        faults.install(
            getattr(settings, "CLEAT_TEST_CRASH_AT", ""),
            getattr(settings, "CLEAT_TEST_CLOCK_OFFSET_SECONDS", 0.0),
        )


def refuse_bad_configuration() -> None:
    """Run cleat's configuration checks and refuse to start on an error: a web server
    (gunicorn, uvicorn) runs no system checks, and would otherwise answer every request that
    needs the setting with a 500. Called by the WSGI and ASGI entry points."""
    from django.core.exceptions import ImproperlyConfigured

    found: list[checks.CheckMessage] = []
    for check in CONFIGURATION_CHECKS:
        found += check()
    errors = [m for m in found if m.level >= checks.ERROR]
    if errors:
        raise ImproperlyConfigured("; ".join(f"{m.obj}: {m.msg} ({m.id})" for m in errors))


def check_fetch_allow_list(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every ``CLEAT_FETCH_ALLOW`` entry must parse (an http(s) URL prefix without
    credentials): a worker refuses to start on one it cannot interpret, rather than deny or
    allow fetches by a rule nobody meant."""
    from django.conf import settings

    from engine.services import AllowRule

    errors: list[checks.CheckMessage] = []
    for entry in getattr(settings, "CLEAT_FETCH_ALLOW", ()):
        try:
            AllowRule.parse(str(entry))
        except ValueError as exc:
            errors.append(checks.Error(str(exc), id="workflows.E001", obj="CLEAT_FETCH_ALLOW"))
    return errors


def check_retention_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every ``CLEAT_RETAIN_*`` setting must be days or ``off``: a worker refuses to start
    on a period it cannot read, rather than purge by a rule nobody meant."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows.retention import default_policy

    try:
        default_policy()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="workflows.E002", obj="CLEAT_RETAIN_*")]
    return []


def check_tracing_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``CLEAT_TRACING`` must be a known mode, and ``otlp`` needs its optional exporter
    package: the web processes and the worker refuse to start rather than trace nowhere."""
    from workflows.tracing import configuration_fault

    fault = configuration_fault()
    return [] if fault is None else [checks.Error(fault, id="workflows.E003", obj="CLEAT_TRACING")]


def check_wake_sweep_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``CLEAT_WAKE_SWEEP_SECONDS`` must be a number of seconds (0: off): a worker refuses to
    start on one it cannot read."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows.maintenance import wake_sweep_seconds

    try:
        wake_sweep_seconds()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="workflows.E004", obj="CLEAT_WAKE_SWEEP_SECONDS")]
    return []


def check_encryption_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``CLEAT_ENCRYPTION_KEYS`` / ``CLEAT_ENCRYPTION_KEY_ID`` must describe usable keys: a
    worker refuses to start rather than store payloads under a key nobody can read back."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows import crypto

    crypto.reset()
    try:
        crypto.keyring()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="workflows.E005", obj="CLEAT_ENCRYPTION_KEYS")]
    return []


def check_dispatch_mode(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``CLEAT_DISPATCH`` must be ``poll`` or ``celery``: a worker refuses to start on a
    mode it cannot read rather than guess how runs are dispatched."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows.dispatch import mode

    try:
        mode()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="workflows.E006", obj="CLEAT_DISPATCH")]
    return []


# The tag of cleat's own system checks: a command that runs a chosen set of checks (the
# worker, which leaves out the web side's) names it to keep them.
CHECK_TAG = "cleat"

# cleat's configuration checks: registered as system checks (manage.py check, runworker) and
# run by the web entry points at start-up (refuse_bad_configuration).
CONFIGURATION_CHECKS: tuple[Callable[..., list[checks.CheckMessage]], ...] = (
    check_fetch_allow_list,
    check_retention_settings,
    check_tracing_settings,
    check_wake_sweep_setting,
    check_encryption_settings,
    check_dispatch_mode,
)
