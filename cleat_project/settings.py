"""Settings for cleat, read from the environment with django-environ.

Nothing needs to be set for the embedded default: SQLite in the project folder, one
worker, DEBUG off unless asked for. ``DATABASE_URL`` switches to PostgreSQL
(``postgres://...``), MySQL/MariaDB (``mysql://...``) or SQL Server (``mssql://...``).
Every engine knob is a ``CLEAT_*`` variable; ``workflows.conf.cleat_settings()`` gathers
them into one typed, validated object.
"""

from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# A `.env` file (`python3 dev.py up` writes one for local development) supplies what the
# environment does not set. CLEAT_ENV_FILE names another file, or none when empty (the test
# settings read none: the suite must not depend on a developer's local file).
_dotenv = Path(env.str("CLEAT_ENV_FILE", default=str(BASE_DIR / ".env")) or "/nonexistent")
if _dotenv.is_file():
    environ.Env.read_env(_dotenv)

DEBUG = env.bool("DEBUG", default=False)

# A fixed development key is only acceptable while DEBUG is on; a production deployment
# that forgot SECRET_KEY must fail at start-up, not sign sessions with a public key.
_DEV_SECRET_KEY = "cleat-insecure-development-key-do-not-use-in-production"
SECRET_KEY = env.str("SECRET_KEY", default=_DEV_SECRET_KEY if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

# --- HTTPS (docs/production.md) ------------------------------------------------------------
# Off by default so that the embedded default works over plain http://localhost; a
# production deployment served over HTTPS turns them on (`manage.py check --deploy` is then
# clean). SECURE_SSL_REDIRECT leaves /healthz and /metrics alone: load balancers and
# Prometheus often probe over plain HTTP inside the network.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = env.list("SECURE_REDIRECT_EXEMPT", default=[r"^healthz$", r"^metrics$"])
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
# Seconds browsers remember to use HTTPS only (0: no Strict-Transport-Security header).
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
# Behind a proxy that terminates TLS: the header it sets and the value meaning HTTPS, e.g.
# "HTTP_X_FORWARDED_PROTO,https". Only set it when the proxy always sets (or strips) that
# header: otherwise a client could claim HTTPS itself.
_proxy_ssl_header = env.list("SECURE_PROXY_SSL_HEADER", default=[])
if _proxy_ssl_header and len(_proxy_ssl_header) != 2:
    raise ImproperlyConfigured(
        "SECURE_PROXY_SSL_HEADER is a header and a value, e.g. HTTP_X_FORWARDED_PROTO,https"
    )
SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header) if _proxy_ssl_header else None
# Origins (scheme and host) the admin's forms may be posted from, when not the host itself.
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files served by us, not a CDN
    "workflows",
    "workflows.api",
    "schedules",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "workflows.middleware.TenantContextMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "cleat_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

WSGI_APPLICATION = "cleat_project.wsgi.application"
ASGI_APPLICATION = "cleat_project.asgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
# The web process closes its connection at the end of each request by default: a threaded
# server (runserver, gunicorn's gthread) has a thread per client connection, and a
# connection kept per thread for a minute exhausted the database's slots. The worker keeps
# its threads' connections (reconnecting per segment cost more than the segment itself in
# the store benchmark): `runworker` applies CLEAT_WORKER_CONN_MAX_AGE instead. Health
# checks drop dead connections either way.
DATABASES["default"]["CONN_MAX_AGE"] = env.int(
    "CONN_MAX_AGE", default=DATABASES["default"].get("CONN_MAX_AGE") or 0
)
CLEAT_WORKER_CONN_MAX_AGE = env.int("CLEAT_WORKER_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # One writer at a time: IMMEDIATE transactions take the write lock up front (no upgrade
    # deadlocks between a worker and the admin), WAL lets readers proceed meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )

# The database password from a credential provider, read at every new connection (cached for
# CLEAT_SECRETS_TTL_SECONDS): "file:/run/secrets/db", "env:NAME", "aws-secretsmanager:ID#field",
# "vault:PATH#field" (workflows/secrets.py). A rotated password is picked up without a restart.
CLEAT_DATABASE_PASSWORD = env.str("CLEAT_DATABASE_PASSWORD", default="")
CLEAT_SECRETS_TTL_SECONDS = env.float("CLEAT_SECRETS_TTL_SECONDS", default=60.0)
CLEAT_AWS_REGION = env.str("CLEAT_AWS_REGION", default="")
CLEAT_AWS_ENDPOINT_URL = env.str("CLEAT_AWS_ENDPOINT_URL", default="")
CLEAT_VAULT_ADDR = env.str("CLEAT_VAULT_ADDR", default="")
CLEAT_VAULT_TOKEN = env.str("CLEAT_VAULT_TOKEN", default="")
CLEAT_VAULT_MOUNT = env.str("CLEAT_VAULT_MOUNT", default="secret")
_PASSWORD_BACKENDS = {
    "django.db.backends.postgresql": "cleat_project.db.postgresql",
    "django.db.backends.mysql": "cleat_project.db.mysql",
}
if CLEAT_DATABASE_PASSWORD:
    _engine = DATABASES["default"]["ENGINE"]
    if _engine not in _PASSWORD_BACKENDS:
        raise ImproperlyConfigured(
            "CLEAT_DATABASE_PASSWORD is read for PostgreSQL and MariaDB/MySQL; DATABASE_URL "
            f"names {_engine}"
        )
    DATABASES["default"]["ENGINE"] = _PASSWORD_BACKENDS[_engine]
    DATABASES["default"]["CLEAT_PASSWORD_SECRET"] = CLEAT_DATABASE_PASSWORD

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# models.W037: MariaDB and MySQL have no partial indexes, so Django makes the run table's
# conditional indexes whole there (larger, with the same answers: migration 0031); the
# warning would otherwise print at every `migrate` on those databases.
SILENCED_SYSTEM_CHECKS = ["models.W037"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "staticfiles")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "cleat": {"handlers": ["console"], "level": env.str("CLEAT_LOG_LEVEL", default="INFO")},
    },
}

# --- REST API (workflows/api, docs/api.md) -----------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "workflows.api.authentication.ApiKeyAuthentication",
        "workflows.api.authentication.StaffSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["workflows.api.permissions.HasRole"],
    "DEFAULT_THROTTLE_CLASSES": ["workflows.api.throttling.ApiKeyRateThrottle"],
    # Per API key; empty disables throttling.
    "DEFAULT_THROTTLE_RATES": {
        "api_key": env.str("CLEAT_API_RATE", default="1200/min") or None,
        # Outcomes that Celery workers outside the project post (docs/celery.md), per address.
        "task_outcome": env.str("CLEAT_TASK_OUTCOME_RATE", default="6000/min") or None,
    },
    "DEFAULT_PARSER_CLASSES": ["workflows.api.parsers.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "workflows.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "workflows.api.schema.CleatAutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "cleat API",
    "DESCRIPTION": (
        "Durable WebAssembly workflows: definitions, runs, promises, schedules. See docs/api.md."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "workflows.models.RunStatus",
        "PromiseStatusEnum": "workflows.models.Promise.State",
        "UpdateStatusEnum": "workflows.models.UpdateRequest.State",
        "ErrorCodeEnum": "workflows.models.ERROR_CODE_CHOICES",
    },
}
# JSON request bodies and uploaded modules larger than these are refused with 413.
CLEAT_API_MAX_BODY_BYTES = env.int("CLEAT_API_MAX_BODY_BYTES", default=2 * 1024 * 1024)
CLEAT_API_MAX_MODULE_BYTES = env.int("CLEAT_API_MAX_MODULE_BYTES", default=64 * 1024 * 1024)
# Extra sensitive field-name substrings (one per line) redacted from API responses.
CLEAT_REDACT_PATTERNS_FILE = env.str("CLEAT_REDACT_PATTERNS_FILE", default="")

# --- cleat -------------------------------------------------------------------------------
# Limits of one execution segment (ABI.md section 5). Defaults are the ABI's.
CLEAT_MEMORY_LIMIT_BYTES = env.int("CLEAT_MEMORY_LIMIT_BYTES", default=32 * 1024 * 1024)
CLEAT_MAX_STRING_BYTES = env.int("CLEAT_MAX_STRING_BYTES", default=1024 * 1024)
CLEAT_SEGMENT_TIMEOUT_SECONDS = env.float("CLEAT_SEGMENT_TIMEOUT_SECONDS", default=30.0)
# The console's "state at step N" replays in the web process: its own, short deadline.
CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS = env.float(
    "CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS", default=2.0
)
CLEAT_FUEL = env.int("CLEAT_FUEL", default=0)  # 0: instruction metering off
CLEAT_MAX_INSTANCES = env.int("CLEAT_MAX_INSTANCES", default=256)
CLEAT_MAX_TABLE_ELEMENTS = env.int("CLEAT_MAX_TABLE_ELEMENTS", default=8 * 1024 * 1024)
CLEAT_MAX_HISTORY_EVENTS = env.int("CLEAT_MAX_HISTORY_EVENTS", default=100_000)
# Compiled-module caches: in memory (entries) and on disk (serialized artifacts).
CLEAT_MODULE_CACHE_SIZE = env.int("CLEAT_MODULE_CACHE_SIZE", default=64)
# The disk cache of compiled modules keeps the most recently used within this size (0: no limit).
CLEAT_MODULE_CACHE_MAX_MB = env.int("CLEAT_MODULE_CACHE_MAX_MB", default=4096)
CLEAT_MODULE_CACHE_DIR = env.str(
    "CLEAT_MODULE_CACHE_DIR", default=str(Path.home() / ".cache" / "cleat" / "modules")
)
# Compiled artifacts shared through the database (workflows/artifacts.py): a deploy's compile
# is read by every worker instead of compiling again.
CLEAT_SHARE_COMPILED = env.bool("CLEAT_SHARE_COMPILED", default=True)
# Services that durable_call reaches: {"service": "dotted.path"} for Python functions,
# {"service": "https://base.url/"} for HTTP services, {"service": "celery:pkg.tasks"} (with
# ?queue=NAME&timeout=SECONDS) for Celery tasks (docs/celery.md).
CLEAT_SERVICES = env.json("CLEAT_SERVICES", default={})
# Bearer tokens HTTP services are called with: {"service": "vault:cleat/billing#token"} (a
# secret setting, workflows/secrets.py, read at each call through its cache) or the token.
CLEAT_SERVICE_TOKENS = env.json("CLEAT_SERVICE_TOKENS", default={})
# "service.operation" strings that record a write-ahead intent before dispatch.
CLEAT_WRITE_AHEAD_OPS = env.list("CLEAT_WRITE_AHEAD_OPS", default=[])
# {"service": "dotted.path"}: asked what happened to a call whose outcome a crash lost.
CLEAT_AMBIGUITY_RESOLVERS = env.json("CLEAT_AMBIGUITY_RESOLVERS", default={})
# URL prefixes fetch() may reach; private and loopback addresses need the second switch.
# Blank items (an empty variable, a trailing comma) are no entry, not "allow everything".
CLEAT_FETCH_ALLOW = [e for e in env.list("CLEAT_FETCH_ALLOW", default=[]) if e.strip()]
CLEAT_FETCH_ALLOW_PRIVATE = env.bool("CLEAT_FETCH_ALLOW_PRIVATE", default=False)
# {"plugin": "dotted.path"}: host plugins reachable through plugin_call.
CLEAT_PLUGINS = env.json("CLEAT_PLUGINS", default={})
# Celery (docs/celery.md): the broker (empty: no Celery), the app cleat publishes with, a
# task call's default timeout, exception classes a task raises for PERMANENT (besides
# engine.errors.PermanentError), and the base URL of this deployment that Celery workers
# outside the project post outcomes to (empty: only the in-project hook reports).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="celery")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = env.int("CELERY_WORKER_PREFETCH_MULTIPLIER", default=1)
# Off: after a reconnect, Celery lowers the prefetch count and raises it again from each
# finished task's acknowledgement -- a basic.qos call from the pool's thread on the
# connection its event loop reads. On a threads pool that stalled a worker for minutes after
# a RabbitMQ restart (its tasks unacknowledged until the broker dropped the connection for
# missed heartbeats, about 3 minutes); with prefetch multiplier 1 there is little to limit.
CELERY_WORKER_ENABLE_PREFETCH_COUNT_REDUCTION = env.bool(
    "CELERY_WORKER_ENABLE_PREFETCH_COUNT_REDUCTION", default=False
)
# Defaults, with CELERY_BROKER_TRANSPORT_OPTIONS's keys over them. confirm_publish (AMQP):
# a publish returns once RabbitMQ has taken the message (on disk, for cleat's durable
# queues), so a broker that stops with the message still in a socket fails the publish,
# and the run publishes it again, instead of losing it while the call counts as sent.
# visibility_timeout (Redis): how long an unacknowledged task waits to be delivered again.
_transport_options = env.json("CELERY_BROKER_TRANSPORT_OPTIONS", default={})
if not isinstance(_transport_options, dict):
    raise ImproperlyConfigured(
        'CELERY_BROKER_TRANSPORT_OPTIONS must be a JSON object, e.g. {"visibility_timeout": 3600}'
    )
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 3600,
    "confirm_publish": True,
    **_transport_options,
}
CLEAT_CELERY_APP = env.str("CLEAT_CELERY_APP", default="cleat_project.celery.app")
CLEAT_CELERY_TIMEOUT_SECONDS = env.float("CLEAT_CELERY_TIMEOUT_SECONDS", default=3600.0)
# How long a publish waits for RabbitMQ's confirm before it fails (and is sent again).
CLEAT_CELERY_CONFIRM_TIMEOUT_SECONDS = env.float(
    "CLEAT_CELERY_CONFIRM_TIMEOUT_SECONDS", default=10.0
)
CLEAT_CELERY_PERMANENT_ERRORS = env.list("CLEAT_CELERY_PERMANENT_ERRORS", default=[])
CLEAT_TASK_CALLBACK_URL = env.str("CLEAT_TASK_CALLBACK_URL", default="")
# Maintenance on Celery beat: the reaper and the schedule tick (every periodic duty) run as
# the beat task cleat.maintenance every CLEAT_BEAT_INTERVAL_SECONDS, not in runworker; the
# reaper there returns runs whose heartbeat is older than CLEAT_LEASE_SECONDS.
CLEAT_MAINTENANCE_ON_BEAT = env.bool("CLEAT_MAINTENANCE_ON_BEAT", default=False)
CLEAT_BEAT_INTERVAL_SECONDS = env.float("CLEAT_BEAT_INTERVAL_SECONDS", default=1.0)
CLEAT_LEASE_SECONDS = env.float("CLEAT_LEASE_SECONDS", default=60.0)
# The queue the beat task cleat.maintenance is sent to (empty: Celery's default queue).
CLEAT_MAINTENANCE_QUEUE = env.str("CLEAT_MAINTENANCE_QUEUE", default="")
# Dispatch (docs/celery.md): "poll" (runworker processes claim from the database) or
# "celery" (a wake-up publishes "run X is ready" to the Celery queue cleat.<task queue>;
# Celery workers claim it). The sweep publishes runs that became due without a wake-up
# (timers, retries, reaped leases) every CLEAT_DISPATCH_SWEEP_SECONDS, and again any run
# still due CLEAT_DISPATCH_REDELIVER_SECONDS after its message (a lost message).
CLEAT_DISPATCH = env.str("CLEAT_DISPATCH", default="poll")
CLEAT_DISPATCH_SWEEP_SECONDS = env.float("CLEAT_DISPATCH_SWEEP_SECONDS", default=1.0)
CLEAT_DISPATCH_REDELIVER_SECONDS = env.float("CLEAT_DISPATCH_REDELIVER_SECONDS", default=10.0)
# Which tenants (ids) and workflow definitions may call a plugin it names:
# {"llm": {"tenants": ["*"], "workflows": ["summarise"]}}; a plugin it does not name is open.
CLEAT_PLUGIN_GUARD = env.json("CLEAT_PLUGIN_GUARD", default={})
# A plugin function that raises (anything but the permanent error) marks its plugin unhealthy
# for this long: calls to it answer ERROR meanwhile, without being made.
CLEAT_PLUGIN_COOLDOWN_SECONDS = env.float("CLEAT_PLUGIN_COOLDOWN_SECONDS", default=60.0)
# Tracing with OpenTelemetry (docs/operations.md, "Tracing"): off, console, otlp (spans sent
# over OTLP/HTTP to CLEAT_OTLP_ENDPOINT, e.g. http://collector:4318/v1/traces; needs
# requirements-otlp.txt) or global (the tracer provider the project set up itself).
CLEAT_TRACING = env.str("CLEAT_TRACING", default="off")
CLEAT_OTLP_ENDPOINT = env.str("CLEAT_OTLP_ENDPOINT", default="")
CLEAT_TRACING_SERVICE_NAME = env.str("CLEAT_TRACING_SERVICE_NAME", default="cleat")
# The web /metrics' backlog gauges per task queue and definition (their names are the
# tenants' own, and /metrics needs no key): off, one series for the fleet.
CLEAT_METRICS_BACKLOG_LABELS = env.bool("CLEAT_METRICS_BACKLOG_LABELS", default=False)
# History compaction (engine/compaction.py): a run's history prefix is folded into one
# checkpoint once this many of its events are rows (0: off).
CLEAT_COMPACT_AFTER_EVENTS = env.int("CLEAT_COMPACT_AFTER_EVENTS", default=1000)
# The stale-version check (and, with CLEAT_VERSION_GC, the version garbage collection) as a
# periodic duty of the workers or of beat (workflows/version_duty.py); 0: never.
CLEAT_VERSION_CHECK_INTERVAL_SECONDS = env.float(
    "CLEAT_VERSION_CHECK_INTERVAL_SECONDS", default=86400.0
)
CLEAT_VERSION_GC = env.bool("CLEAT_VERSION_GC", default=False)
# Adaptive group commit (PostgreSQL; workflows/store/group_commit.py): above this many
# per-step appends per second in a worker process, the appends of its running segments are
# written in shared transactions: what arrives while one is being written, closed when that
# write ends, at MAX_EVENTS events or after MAX_WAIT_MS (0: always batched); below half of it
# each is written on its own. Completed runs' finalizes are batched the same way, their rate
# counted apart. CLEAT_GROUP_COMMIT=false: always on its own.
CLEAT_GROUP_COMMIT = env.bool("CLEAT_GROUP_COMMIT", default=True)
CLEAT_GROUP_COMMIT_MIN_RATE = env.float("CLEAT_GROUP_COMMIT_MIN_RATE", default=200.0)
CLEAT_GROUP_COMMIT_MAX_EVENTS = env.int("CLEAT_GROUP_COMMIT_MAX_EVENTS", default=64)
CLEAT_GROUP_COMMIT_MAX_WAIT_MS = env.float("CLEAT_GROUP_COMMIT_MAX_WAIT_MS", default=2.0)
# Threads one batch of durable calls (ctx.gather, durable_call_many) is made on.
CLEAT_MAX_PARALLEL_CALLS = env.int("CLEAT_MAX_PARALLEL_CALLS", default=8)
# Fresh instances of each recently run Python workflow kept made ahead of the segments that
# take them, on a thread of their own (engine/ready_instances.py); 0: each made inline.
CLEAT_READY_INSTANCES = env.int("CLEAT_READY_INSTANCES", default=2)
# Those instances get the pages a first call touches in place ahead (Linux): a segment's
# start 0.7-1 ms shorter, the faults taken on the maker's thread (docs/python-workflows.md).
CLEAT_WARM_PAGES = env.bool("CLEAT_WARM_PAGES", default=True)
# A waiting run re-checks its wait at least this often: the last resort for a wake-up lost to
# a crash, which the wake sweep finds within seconds. Each re-check is a segment, so 100,000
# waiting runs at an hour cost ~28 segments/s (at 5 minutes: 333).
CLEAT_WAIT_RECHECK_SECONDS = env.float("CLEAT_WAIT_RECHECK_SECONDS", default=3600.0)
# The wake sweep: every this many seconds each worker (or beat) wakes waiting runs whose
# wake-up a crash lost between the satisfying commit and the wake (0: off; the re-check then).
CLEAT_WAKE_SWEEP_SECONDS = env.float("CLEAT_WAKE_SWEEP_SECONDS", default=3.0)
# Fairness between tenants: most runs of one tenant running at once, for a tenant that sets
# none in the admin (0: no cap); the highest run priority an API key of each role may ask
# for (priorities range from -100 to 100; the admin and commands may use the whole range);
# most runs one schedule backfill may start.
CLEAT_TENANT_MAX_RUNNING = env.int("CLEAT_TENANT_MAX_RUNNING", default=100)
CLEAT_PRIORITY_MAX_BY_ROLE = env.json(
    "CLEAT_PRIORITY_MAX_BY_ROLE", default={"operator": 10, "admin": 100}
)
CLEAT_MAX_BACKFILL_RUNS = env.int("CLEAT_MAX_BACKFILL_RUNS", default=100)
# Signal authorization (engine/policies.py): on, a run may be signalled only by the workflows
# its definition's allowed_signal_callers names (an empty list: none), and from outside only
# by API keys marked may_signal and users with the workflows.signal_workflowinstance
# permission.
CLEAT_REQUIRE_SIGNAL_AUTH = env.bool("CLEAT_REQUIRE_SIGNAL_AUTH", default=False)
# Quotas (engine/policies.py), 0 meaning unlimited; a tenant's admin page overrides each.
CLEAT_MAX_CHILDREN_PER_RUN = env.int("CLEAT_MAX_CHILDREN_PER_RUN", default=0)
CLEAT_MAX_LOCKS_PER_RUN = env.int("CLEAT_MAX_LOCKS_PER_RUN", default=0)
CLEAT_MAX_SCHEDULES_PER_TENANT = env.int("CLEAT_MAX_SCHEDULES_PER_TENANT", default=100)
# PostgreSQL: the role the application connects as (created by the migrations).
CLEAT_APP_ROLE = env.str("CLEAT_APP_ROLE", default="cleat_app")
CLEAT_APP_ROLE_PASSWORD = env.str("CLEAT_APP_ROLE_PASSWORD", default="")
# Schedules: the worker loop runs the scheduler tick (off: run `manage.py runscheduler`), and
# an instant handled later than this is a misfire (its schedule's misfire policy applies).
CLEAT_SCHEDULER_IN_WORKER = env.bool("CLEAT_SCHEDULER_IN_WORKER", default=True)
CLEAT_SCHEDULE_MISFIRE_GRACE_SECONDS = env.float(
    "CLEAT_SCHEDULE_MISFIRE_GRACE_SECONDS", default=60.0
)
# Fault injection, for the fault-injection tests only (workflows/faults.py): crash points to
# arm (e.g. "after_call:3") and an offset of this process's clock. Never set in production.
CLEAT_TEST_CRASH_AT = env.str("CLEAT_TEST_CRASH_AT", default="")
CLEAT_TEST_CLOCK_OFFSET_SECONDS = env.float("CLEAT_TEST_CLOCK_OFFSET_SECONDS", default=0.0)
# Retention (workflows/retention.py, docs/operations.md "Data lifetime"): days each kind of
# data is kept, or "off" to keep it forever; tenants and definitions override them in the
# admin and through /api/v1/retention. The worker purges every CLEAT_PURGE_INTERVAL_SECONDS
# (0: never; run `manage.py purge` instead).
CLEAT_RETAIN_FINISHED_DAYS = env.str("CLEAT_RETAIN_FINISHED_DAYS", default="30")
CLEAT_RETAIN_DEAD_LETTERED_DAYS = env.str("CLEAT_RETAIN_DEAD_LETTERED_DAYS", default="90")
CLEAT_RETAIN_START_KEYS_DAYS = env.str("CLEAT_RETAIN_START_KEYS_DAYS", default="30")
CLEAT_RETAIN_SERVICE_KEYS_DAYS = env.str("CLEAT_RETAIN_SERVICE_KEYS_DAYS", default="30")
CLEAT_RETAIN_AUDIT_DAYS = env.str("CLEAT_RETAIN_AUDIT_DAYS", default="365")
CLEAT_PURGE_INTERVAL_SECONDS = env.float("CLEAT_PURGE_INTERVAL_SECONDS", default=3600.0)
# Encryption at rest (workflows/crypto.py, docs/operations.md "Data lifetime"): a JSON object
# of key id -> base64 of 32 random bytes, and the id of the key new payloads are sealed with
# (optional with one key). Empty: payloads are stored as plaintext. `manage.py rotate_keys`
# re-seals old rows under the current key.
CLEAT_ENCRYPTION_KEYS = env.str("CLEAT_ENCRYPTION_KEYS", default="")
CLEAT_ENCRYPTION_KEY_ID = env.str("CLEAT_ENCRYPTION_KEY_ID", default="")
