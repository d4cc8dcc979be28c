"""Django settings for creditshop, read from the environment with defaults that work on a developer machine."""

from datetime import timedelta
from pathlib import Path

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from core.contract import (
    PURGE_IDEMPOTENCY_KEYS_TASK,
    PURGE_PUBLISHED_TASK,
    QUEUE_TYPE_CLASSIC,
    QUEUE_TYPE_QUORUM,
    RUN_NIGHTLY_TASK,
    SCHEMA_VERSION_1,
    SCHEMA_VERSION_2,
    SCHEMA_VERSIONS,
    SWEEP_TASK,
)
from core.deadlines import database_settings
from core.env import env_bool, env_choice, env_database, env_float, env_int, env_int_set, env_list, env_rate, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DJANGO_DEBUG", True)
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me-in-production-0123456789abcdef")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before rest_framework.authtoken: its drf_create_token command makes hashed tokens (accounts/management/).
    "accounts",
    "rest_framework",
    # Kept one release for its table of plain-text keys, which accounts' data migration hashed (docs/OPERATIONS.md
    # "API tokens" says how it is dropped).
    "rest_framework.authtoken",
    "axes",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "core",
    "orders",
    "outbox",
    "credits",
    "analytics",
    "demo",
]

MIDDLEWARE = [
    "core.middleware.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Right after SecurityMiddleware, as WhiteNoise asks: static files are answered before sessions or auth run.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a locked-out admin login into its refusal page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

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


def _mariadb(url_variable: str, default_url: str) -> dict:
    """Return a DATABASES entry for one service's MariaDB/MySQL database, read from its URL variable."""
    database = env_database(url_variable, default_url)
    session = "SET sql_mode='STRICT_TRANS_TABLES,NO_ZERO_DATE,NO_ENGINE_SUBSTITUTION', time_zone='+00:00'"
    # On a Galera cluster (docs/OPERATIONS.md, "A Galera cluster") reads, and transactions' first statements, wait
    # until the node has applied every write set the cluster committed before them (1: wsrep_sync_wait's READ), so a
    # writer the endpoint just failed over to never answers from rows older than what a client was already told.
    if sync_wait := env_int("DATABASE_WSREP_SYNC_WAIT", 0, minimum=0, maximum=15):
        session += f", wsrep_sync_wait={sync_wait}"
    database.update(
        {
            # Django's MySQL backend with a health check that makes no round trip (core/mysql/base.py).
            "ENGINE": "core.mysql",
            # Persistent connections, checked before reuse, so a connection the server killed heals on the next
            # request.
            "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 300, minimum=0),
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": {
                "charset": "utf8mb4",
                # READ COMMITTED: no gap locks, so concurrent inserts and SKIP LOCKED claims do not block each other.
                "isolation_level": "read committed",
                "init_command": session,
            },
            "TEST": {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"},
        }
    )
    # Connect, read and write deadlines and the server-side statement limit: the settings' role's here; the web, the
    # relay and the workers set their own when they start (core/deadlines.py has the table).
    database_settings(database)
    return database


# Two services, two databases (config/routers.py): the order service's (orders, transaction_log, auth, admin,
# analytics) and the credits service's (order_credits, balances, dead letters). Only messages cross between them.
# Both URLs may name one database for a small install.
DATABASES = {
    "default": _mariadb("DATABASE_URL", "mysql://root:@127.0.0.1:3306/creditshop"),
    "credits": _mariadb("CREDITS_DATABASE_URL", "mysql://root:@127.0.0.1:3306/creditshop_credits"),
}
DATABASE_ROUTERS = ["config.routers.ServiceRouter"]
# The nightly job's reads (never its writes) may go to a replica of each service's database, so the night's full
# scan of a day never loads the primaries: an alias per replica, named in ANALYTICS_READ_DATABASES by the primary's
# alias (docs/ANALYTICS.md, "Reading from replicas"). Tests mirror the primary's test database.
ANALYTICS_READ_DATABASES = {}
for _alias, _variable in (("default", "ANALYTICS_ORDERS_READ_URL"), ("credits", "ANALYTICS_CREDITS_READ_URL")):
    if env_str(_variable, ""):
        DATABASES[f"{_alias}_nightly_read"] = _mariadb(_variable, "") | {"TEST": {"MIRROR": _alias}}
        ANALYTICS_READ_DATABASES[_alias] = f"{_alias}_nightly_read"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# django-axes first: it refuses a locked-out login before any password is checked.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
# Admin login throttle (django-axes): failures are counted in the database, so every web process sees them all. After
# AXES_FAILURE_LIMIT failures from one address, or for one username, logins from there or for it are refused for
# AXES_COOLOFF_MINUTES (a success first resets the count). Staff see attempts and lockouts under /admin/axes/.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15, minimum=1))
# Each on its own: an address, or a username. The address is REMOTE_ADDR, the peer gunicorn sees (behind a proxy:
# docs/OPERATIONS.md, "Admin login throttle").
AXES_LOCKOUT_PARAMETERS = ["ip_address", "username"]
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Timestamps on pages read as YYYY-MM-DD HH:MM:SS UTC (config/formats/en/formats.py), not Django's "Nov. 22, ..." form.
FORMAT_MODULE_PATH = "config.formats"

STATIC_URL = "static/"
# collectstatic (scripts/setup.sh) writes here; the web process serves it through WhiteNoise, no separate web server.
STATIC_ROOT = Path(env_str("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# Files of the project itself (the favicon), beside each app's static/.
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Content-hashed names (cached for a year by browsers) plus gzip copies; needs collectstatic's manifest.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Request bodies above this size answer 413 before anything parses them.
API_MAX_BODY_BYTES = 64 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES

ORDERS_RATE_LIMIT = env_rate("ORDERS_RATE_LIMIT", "20/second")
# An API token's row (its user, its expiry) is cached this long in Redis (accounts/authentication.py); 0: never.
API_TOKEN_CACHE_SECONDS = env_int("API_TOKEN_CACHE_SECONDS", 30, minimum=0)
# The key of the HMAC that API keys are stored as (accounts/keys.py). Changing it invalidates every token; set it
# apart from DJANGO_SECRET_KEY so rotating that one leaves tokens working.
API_TOKEN_DIGEST_KEY = env_str("API_TOKEN_DIGEST_KEY", SECRET_KEY)
# An Idempotency-Key is honoured this long (as the big payment APIs do); a retry after that places a new order.
IDEMPOTENCY_KEY_RETENTION_HOURS = env_int("IDEMPOTENCY_KEY_RETENTION_HOURS", 24, minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "core.negotiation.ContentNegotiation",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "creditshop API",
    "DESCRIPTION": "Orders written atomically with their outbox message; credits awarded exactly once in effect.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and ReDoc from our own static files (drf-spectacular-sidecar): the docs work with no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Links from a placed order to its reads, for generated clients and schemathesis' stateful tests.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.openapi.add_links"],
}

# Shared cache: the order throttle counts there, so its limit holds across every gunicorn worker and host.
# Short socket timeouts: when Redis is unreachable the throttle fails open (core/throttling.py) and an order
# request should lose at most a second finding that out, not hang.
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every process of one deployment must use the same prefix: the web rings the relay loop's bell under it.
CACHE_KEY_PREFIX = env_str("CACHE_KEY_PREFIX", "creditshop")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": CACHE_KEY_PREFIX,
        # Once a command found Redis silent, the process's others fail at once for a few seconds (core/cache.py).
        "OPTIONS": {
            "socket_connect_timeout": 0.5,
            "socket_timeout": 1.0,
            "pool_class": "core.cache.FailFastConnectionPool",
        },
    }
}

# Celery: broker, queues and delivery guarantees are explained in config/celery.py.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
# classic: one broker node (the default: a queue's type cannot change in place, so existing brokers keep working);
# quorum: replicated on a RabbitMQ cluster, with delayed retries in the broker. Read by config.celery.task_queues.
CELERY_QUEUE_TYPE = env_choice("CELERY_QUEUE_TYPE", QUEUE_TYPE_CLASSIC, (QUEUE_TYPE_CLASSIC, QUEUE_TYPE_QUORUM))

# Outbox relay.
OUTBOX_MAX_ATTEMPTS = env_int("OUTBOX_MAX_ATTEMPTS", 10, minimum=1)
OUTBOX_RETENTION_DAYS = env_int("OUTBOX_RETENTION_DAYS", 7, minimum=1)
OUTBOX_SWEEP_SECONDS = env_float("OUTBOX_SWEEP_SECONDS", 5.0, minimum=0.1)
OUTBOX_BATCH_SIZE = env_int("OUTBOX_BATCH_SIZE", 500, minimum=1, maximum=10_000)
OUTBOX_STUCK_SECONDS = env_int("OUTBOX_STUCK_SECONDS", 300, minimum=1)
# A claimed row is hidden from other relays this long; a relay that dies holding it publishes it again after this.
# Must exceed the confirm timeout plus the time to mark a batch.
OUTBOX_LEASE_SECONDS = env_float("OUTBOX_LEASE_SECONDS", 60.0, minimum=1.0)
OUTBOX_CONFIRM_TIMEOUT_SECONDS = env_float("OUTBOX_CONFIRM_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# Failed publishes wait base * 2^(attempts-1) seconds, capped, with jitter (see outbox/retry.py).
OUTBOX_BACKOFF_BASE_SECONDS = env_float("OUTBOX_BACKOFF_BASE_SECONDS", 2.0, minimum=0.01)
OUTBOX_BACKOFF_MAX_SECONDS = env_float("OUTBOX_BACKOFF_MAX_SECONDS", 600.0, minimum=0.01)
# The dedicated relay loop polls at most this far apart when nothing is due.
OUTBOX_IDLE_SECONDS = env_float("OUTBOX_IDLE_SECONDS", 1.0, minimum=0.01)
# Wake-ups closer together than this fold into one relay task (sent at the trailing edge), across every web process
# (a gate in Redis, outbox/wakeup.py): the longest a committed row waits for its wake-up, and at most 1/interval
# relay tasks a second under load: shorter makes many drains of a few rows each (docs/PERFORMANCE.md).
OUTBOX_WAKE_INTERVAL_SECONDS = env_float("OUTBOX_WAKE_INTERVAL_SECONDS", 0.025, minimum=0.0)
# Under sustained load, wake-ups fold over a longer interval: bigger drains, less CPU per order (outbox/bell.py).
OUTBOX_WAKE_BUSY_RATE = env_int("OUTBOX_WAKE_BUSY_RATE", 200, minimum=0)
OUTBOX_WAKE_BUSY_INTERVAL_SECONDS = env_float("OUTBOX_WAKE_BUSY_INTERVAL_SECONDS", 0.1, minimum=0.0)
OUTBOX_RETENTION_BATCH_SIZE = env_int("OUTBOX_RETENTION_BATCH_SIZE", 1000, minimum=1, maximum=50_000)
CELERY_BEAT_SCHEDULE = {
    # Safety net for lost wake-ups and for rows whose backoff has run out.
    "outbox-sweep": {
        "task": SWEEP_TASK,
        "schedule": OUTBOX_SWEEP_SECONDS,
        "options": {"expires": OUTBOX_SWEEP_SECONDS},
    },
    "outbox-purge-published": {"task": PURGE_PUBLISHED_TASK, "schedule": 3600.0, "options": {"expires": 3600.0}},
    "orders-purge-idempotency-keys": {
        "task": PURGE_IDEMPOTENCY_KEYS_TASK,
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
}

# Credits consumer.
CREDITS_MAX_RETRIES = env_int("CREDITS_MAX_RETRIES", 3, minimum=0)
# Backoff between retries of a transient failure: exponential from the base, capped, jittered (see credits/retry.py).
CREDITS_RETRY_BASE_SECONDS = env_float("CREDITS_RETRY_BASE_SECONDS", 1.0, minimum=0.01)
CREDITS_RETRY_MAX_SECONDS = env_float("CREDITS_RETRY_MAX_SECONDS", 60.0, minimum=0.01)
# How long one delivery waits for an unreachable credits database before it goes back to the queue, its retries
# untouched (credits/outage.py). A prefork worker's parent sends the broker's heartbeats meanwhile; a solo worker
# negotiates none (config/celery.py), so the wait never costs it its connection.
CREDITS_OUTAGE_WAIT_SECONDS = env_float("CREDITS_OUTAGE_WAIT_SECONDS", 30.0, minimum=0.1, maximum=100.0)

# Time limits of every task (Celery reads them under these names; prefork pools enforce them, solo and threads pools
# cannot): a hung task (a query no timeout covers, a lock never released) gives its worker process back. At the soft
# limit the task gets SoftTimeLimitExceeded, which the award's failure path retries like any unexpected error; at the
# hard limit the pool process is killed and replaced, and an award's message goes back to the queue (acks_late,
# credits/tasks.py). The longest legitimate task is an award that waits out a credits outage and then records a
# dead letter through another (2 x CREDITS_OUTAGE_WAIT_SECONDS, at most 200 s); a relay task stops at 30 s.
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 330, minimum=2)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        f"CELERY_TASK_TIME_LIMIT ({CELERY_TASK_TIME_LIMIT}) must be above CELERY_TASK_SOFT_TIME_LIMIT"
        f" ({CELERY_TASK_SOFT_TIME_LIMIT}): the soft limit lets the task end itself first"
    )

# /metrics answers only a scraper that sends "Authorization: Bearer <METRICS_TOKEN>"; unset leaves it open (a developer
# machine, or a port only Prometheus can reach).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# Message versions (core/contract.py; the rollout order is in docs/OPERATIONS.md, "Deploying a new version").
# The version the order service writes: raise it only once every credits consumer accepts it.
ORDER_MESSAGE_VERSION = env_int(
    "ORDER_MESSAGE_VERSION", SCHEMA_VERSION_1, minimum=min(SCHEMA_VERSIONS), maximum=max(SCHEMA_VERSIONS)
)
# The versions a credits consumer accepts; it takes only their queues (core/credits_queues.py). A message of another
# version waits in its own queue for a consumer that accepts it, for at most CREDITS_UNKNOWN_VERSION_WAIT_SECONDS
# (its time to live, given by the relay); then it is dead-lettered (version_not_supported). An older one reaching a
# consumer is dead-lettered at once (unsupported_schema).
CREDITS_ACCEPTED_MESSAGE_VERSIONS = env_int_set(
    "CREDITS_ACCEPTED_MESSAGE_VERSIONS", (SCHEMA_VERSION_1, SCHEMA_VERSION_2), allowed=SCHEMA_VERSIONS
)
CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = env_float("CREDITS_UNKNOWN_VERSION_WAIT_SECONDS", 3600.0, minimum=0.0)

# Analytics.
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
SPARK_JDBC_JAR = env_str("SPARK_JDBC_JAR", "/usr/share/java/mariadb-java-client.jar")
REPORTS_DIR = Path(env_str("REPORTS_DIR", str(BASE_DIR / "reports")))
CONSISTENCY_GRACE_SECONDS = env_int("CONSISTENCY_GRACE_SECONDS", 600, minimum=0)
# Spark: memory for the driver (which is also the only executor under local[*]) and for cluster executors;
# SPARK_CONF adds any other Spark property as comma-separated key=value pairs (e.g. spark.driver.host=10.0.0.5).
SPARK_DRIVER_MEMORY = env_str("SPARK_DRIVER_MEMORY", "2g")
SPARK_EXECUTOR_MEMORY = env_str("SPARK_EXECUTOR_MEMORY", "2g")
SPARK_CONF = env_list("SPARK_CONF", [])
# Where the partitioned Parquet datasets go: any Hadoop URL (hdfs://, s3a://); empty means REPORTS_DIR/parquet.
ANALYTICS_PARQUET_URL = env_str("ANALYTICS_PARQUET_URL", "")
# Rows read on each side of the reported days, so credits awarded just after midnight meet their orders.
ANALYTICS_LOOKBACK_HOURS = env_int("ANALYTICS_LOOKBACK_HOURS", 6, minimum=0, maximum=24 * 31)
ANALYTICS_JDBC_PARTITIONS = env_int("ANALYTICS_JDBC_PARTITIONS", 4, minimum=1, maximum=256)
ANALYTICS_JDBC_FETCHSIZE = env_int("ANALYTICS_JDBC_FETCHSIZE", 10_000, minimum=1)
ANALYTICS_SHUFFLE_PARTITIONS = env_int("ANALYTICS_SHUFFLE_PARTITIONS", 8, minimum=1, maximum=10_000)
# Violations kept in MySQL per check and day; the count is always exact.
ANALYTICS_MAX_STORED_VIOLATIONS = env_int("ANALYTICS_MAX_STORED_VIOLATIONS", 10_000, minimum=1)
# Users whose rows the nightly run compares row by row whatever their checksums say (docs/ANALYTICS.md, "Audit").
ANALYTICS_AUDIT_USERS = env_int("ANALYTICS_AUDIT_USERS", 100, minimum=0)
# Celery beat starts the nightly run at this UTC time; the run itself is a subprocess with this time limit.
ANALYTICS_NIGHTLY_HOUR = env_int("ANALYTICS_NIGHTLY_HOUR", 2, minimum=0, maximum=23)
ANALYTICS_NIGHTLY_MINUTE = env_int("ANALYTICS_NIGHTLY_MINUTE", 0, minimum=0, maximum=59)
ANALYTICS_RUN_TIMEOUT_SECONDS = env_int("ANALYTICS_RUN_TIMEOUT_SECONDS", 3 * 3600, minimum=60)
# The run (and its Spark JVM) yields the cores to the order path on a host they share: a batch job may take longer,
# an order may not. 0 runs it at the worker's own priority.
ANALYTICS_RUN_NICENESS = env_int("ANALYTICS_RUN_NICENESS", 10, minimum=0, maximum=19)
# The nightly Spark reports for yesterday (UTC); the task runs them in a subprocess, never in the worker.
CELERY_BEAT_SCHEDULE[RUN_NIGHTLY_TASK] = {
    "task": RUN_NIGHTLY_TASK,
    "schedule": crontab(hour=ANALYTICS_NIGHTLY_HOUR, minute=ANALYTICS_NIGHTLY_MINUTE),
}
# The nightly task's own time limits, past the subprocess's ANALYTICS_RUN_TIMEOUT_SECONDS (which kills the command and
# its Spark JVM first): they stop the task only if it hangs after its command ended.
CELERY_TASK_ANNOTATIONS = {
    RUN_NIGHTLY_TASK: {
        "soft_time_limit": ANALYTICS_RUN_TIMEOUT_SECONDS + 60,
        "time_limit": ANALYTICS_RUN_TIMEOUT_SECONDS + 120,
    }
}

if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# Logs: plain text, or one JSON object per line with LOG_FORMAT=json; either way every record carries trace_id,
# span_id and transaction_id (core/logs.py). Tracing itself is configured by the OTEL_* variables (core/tracing.py).
LOG_FORMAT = env_str("LOG_FORMAT", "plain").lower()
# With tracing on, the workers and the relay add a span per SQL statement (the web never does: config/wsgi.py).
TRACING_SQL_SPANS = env_bool("TRACING_SQL_SPANS", True)
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r} is not one of plain, json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"trace_context": {"()": "core.logs.TraceContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "core.logs.json_formatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["trace_context"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # Request logs would carry the Authorization header on errors; django.request logs paths and status only.
    # django-axes logs each failed login and lockout as a warning; its INFO lines (a banner at every start, the same
    # failure again) are noise.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}
