"""Configuration from the environment, with embedded defaults for one laptop.

DATABASE_URL, REDIS_URL, SECRET_KEY, PROMESA_ENCRYPTION_KEY, PROMESA_ALLOW_PRIVATE_TARGETS.
Keys that are not given are generated once and kept in the instance folder; keys that are given
are judged (`secret_problem`) before a serving command starts.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet

# The secrets an installation is given in its environment, and the shortest each may be.
SECRETS = ("SECRET_KEY", "PROMESA_ENCRYPTION_KEY", "PROMESA_METRICS_TOKEN")
MIN_SECRET_LENGTH = 32
# Words that mark a value copied from an example rather than made for this installation.
_PLACEHOLDER = re.compile(r"change.?me|replace.?me|placeholder|example|fill.?in|your.?(secret|key|token)|"
                          r"^(secret|password|token|key|test|dev|default)$", re.IGNORECASE)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def normalize_database_url(url: str) -> str:
    """Accept the usual postgres:// spellings and use the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _kept_secret(instance: Path, name: str, make) -> str:
    """A key generated on first use and kept in the instance folder (mode 600). Processes starting
    together agree on one key: it is written whole to a temporary file, then linked into place."""
    path = instance / name
    if path.exists():
        return path.read_text().strip()
    instance.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=instance, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(make())
        os.link(temporary, path)  # atomic, and fails if another process got there first
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)
    return path.read_text().strip()


def make_secret() -> str:
    """A new SECRET_KEY or PROMESA_METRICS_TOKEN: 256 random bits."""
    return secrets.token_hex(32)


def make_encryption_key() -> str:
    return Fernet.generate_key().decode()


def secret_problem(name: str, value: str) -> str | None:
    """What is wrong with a secret given in the environment (placeholder, short, guessable), or None."""
    if _PLACEHOLDER.search(value):
        return f"{name} is a placeholder, not a key made for this installation"
    if name == "PROMESA_ENCRYPTION_KEY":
        try:
            raw = base64.urlsafe_b64decode(value.encode("ascii"))
        except (UnicodeEncodeError, binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            return f"{name} is not a Fernet key (32 url-safe base64-encoded bytes)"
        if len(set(raw)) < 16:  # 32 random bytes repeat a value a few times at most
            return f"{name} has too little randomness in it (its bytes repeat)"
        return None
    if len(value) < MIN_SECRET_LENGTH:
        return f"{name} is {len(value)} characters long; it needs at least {MIN_SECRET_LENGTH} random ones"
    if len(set(value)) < 8 or _repeats(value[:256]):
        return f"{name} has too little randomness in it (few distinct characters, or a repeated pattern)"
    return None


def _repeats(value: str) -> bool:
    """Is the value a short run repeated (abcabcabc…, 0123456789012…)?"""
    return any(all(value[i] == value[i - period] for i in range(period, len(value)))
               for period in range(1, len(value) // 2 + 1))


# Set by `promesa up` and `promesa web` for the processes they start: the address they serve the dashboard at,
# which is PROMESA_BASE_URL's default there.
SERVED_URL = "PROMESA_SERVED_URL"


def served_url(host: str, port: int) -> str:
    """The address a browser on this machine opens for a server bound to host:port."""
    if host in ("", "0.0.0.0", "::"):
        host = "localhost"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


# The instance folder's variable; 0.1 called it PROMESA_INSTANCE_PATH, still read when PROMESA_HOME is unset.
HOME = "PROMESA_HOME"
OLD_HOME = "PROMESA_INSTANCE_PATH"


def instance_folder(env=None) -> str:
    """Where this instance keeps what it writes (the embedded SQLite database, the embedded Redis's file, keys
    generated when none are given): PROMESA_HOME, else the current directory's instance/, never beside the
    installed package. Both variables naming different folders is a mistake said at once."""
    env = os.environ if env is None else env
    home, old = env.get(HOME), env.get(OLD_HOME)
    if home and old and Path(home).resolve() != Path(old).resolve():
        raise ValueError(f"{HOME}={home} and {OLD_HOME}={old} name different instance folders: "
                         f"set {HOME} only ({OLD_HOME} is its name from 0.1)")
    return str(Path(home or old).absolute()) if home or old else str(Path.cwd() / "instance")


def from_environment(instance_path: str) -> dict:
    instance = Path(instance_path)
    env = os.environ
    database_url = env.get("DATABASE_URL") or f"sqlite:///{instance / 'promesa.db'}"
    served = {"PROMESA_BASE_URL": env[SERVED_URL]} if env.get(SERVED_URL) else {}
    return {
        **served,
        "SQLALCHEMY_DATABASE_URI": normalize_database_url(database_url),
        "REDIS_URL": env.get("REDIS_URL") or None,
        "SECRET_KEY": env.get("SECRET_KEY") or _kept_secret(instance, "secret_key", make_secret),
        "PROMESA_ENCRYPTION_KEY": env.get("PROMESA_ENCRYPTION_KEY")
        or _kept_secret(instance, "encryption_key", make_encryption_key),
        "PROMESA_ALLOW_PRIVATE_TARGETS": _truthy(env.get("PROMESA_ALLOW_PRIVATE_TARGETS")),
    }


def overrides_from_environment(defaults: dict) -> dict:
    """Any PROMESA_* default can be set from the environment, parsed as the default's type."""
    out = {}
    for key, default in defaults.items():
        raw = os.environ.get(key)
        if raw is None or not key.startswith("PROMESA_"):
            continue
        if isinstance(default, bool):
            out[key] = _truthy(raw)
        elif isinstance(default, int):
            out[key] = int(raw)
        elif isinstance(default, float):
            out[key] = float(raw)
        else:
            out[key] = raw
    return out


DEFAULTS = {
    "SQLALCHEMY_ENGINE_OPTIONS": {},
    # A dashboard stays open for hours: the CSRF token lives as long as the session.
    "WTF_CSRF_TIME_LIMIT": None,
    # The session cookie never rides along on a cross-site POST; `Secure` is added per request over https.
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_HTTPONLY": True,
    # How many reverse proxies in front of the web may set X-Forwarded-For/-Proto (0: trust none).
    "PROMESA_TRUSTED_PROXIES": 0,
    # Failed sign-ins allowed per account and per client address before a 429 (limits' notation).
    "PROMESA_LOGIN_LIMIT_PER_ACCOUNT": "5 per 15 minutes",
    "PROMESA_LOGIN_LIMIT_PER_ADDRESS": "30 per 15 minutes",
    # A dashboard session ends after this long without a page opened or a button pressed (a page's own
    # polling does not count), and this long after its sign-in whatever happens (docs/dashboard.md).
    "PROMESA_SESSION_IDLE_HOURS": 12.0,
    "PROMESA_SESSION_MAX_DAYS": 7.0,
    # The shortest new password (dashboard.accounts.passwords has the rest of the rule).
    "PROMESA_PASSWORD_MIN_LENGTH": 12,
    "PROMESA_REDIS_PREFIX": "promesa",
    # How long one Redis call waits for a connection or an answer before Redis counts as away. A Redis
    # that hangs without closing (a paused server, a dropped network) must not hang a page, ingest or a loop.
    "PROMESA_REDIS_TIMEOUT_SECONDS": 3.0,
    # A PostgreSQL that stopped answering (a network cut) is away after this long: to connect, or to acknowledge.
    "PROMESA_DATABASE_TIMEOUT_SECONDS": 10.0,
    # /readyz and `promesa status`: how long the database and Redis each have to answer.
    "PROMESA_READY_TIMEOUT_SECONDS": 1.0,
    "PROMESA_QUEUE": "promesa",
    # Long-polled pulls one web process keeps waiting (without a thread each), in all and per team; one
    # over either bound is answered at once with 503 or 429 (docs/performance.md has the measured limit).
    "PROMESA_PULL_WAITS_PER_PROCESS": 900,
    "PROMESA_PULL_WAITS_PER_TEAM": 100,
    # How many drain jobs may run at once across all workers.
    "PROMESA_DRAINERS": 4,
    # Largest accepted request body on the producer API, and largest `data` in an event.
    "PROMESA_MAX_BODY_BYTES": 1024 * 1024,
    "PROMESA_MAX_DATA_BYTES": 8 * 1024,
    # In-flight HTTP requests per worker, and per subscription within one worker.
    "PROMESA_MAX_IN_FLIGHT": 64,
    "PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION": 8,
    # Seconds one drain job runs before handing over to a fresh job.
    "PROMESA_DRAIN_BUDGET_SECONDS": 30.0,
    # An idle drain job waits this long for new work before it ends (keeping its warm connections).
    "PROMESA_DRAIN_LINGER_SECONDS": 2.0,
    "PROMESA_SWEEP_INTERVAL_SECONDS": 60.0,
    # A listen session (`promesa-receiver listen`) not pulled for this long is deleted by the sweeper: its
    # client died without ending it.
    "PROMESA_LISTEN_IDLE_SECONDS": 600,
    "PROMESA_RESPONSE_EXCERPT_BYTES": 1024,
    # A worker reserves a rate-limited endpoint's turns up to this far ahead, and waits for them itself.
    "PROMESA_RATE_LIMIT_LOOKAHEAD_SECONDS": 0.5,
    # How long a claimed delivery stays a worker's before the sweeper may hand it to another. A drain
    # renews the leases of what it holds every third of this, so it bounds how long the work of a
    # worker killed outright (SIGKILL, a lost machine) waits, not how long a delivery may wait here.
    "PROMESA_LEASE_SECONDS": 30,
    # Dead letters a bulk replay re-queues per transaction (its progress moves chunk by chunk).
    "PROMESA_REPLAY_CHUNK": 500,
    # Links in notifications (Slack messages, JSON events) point here: the dashboard's public address.
    "PROMESA_BASE_URL": "http://localhost:5000",
    # A subscription whose every attempt has failed this long is disabled by the system (Svix: 5 days);
    # the clock starts once a streak has this many failed attempts.
    "PROMESA_AUTO_DISABLE_DAYS": 5.0,
    "PROMESA_AUTO_DISABLE_AFTER_FAILURES": 5,
    # The `backlog` rule: Promesa's own health, when the oldest due delivery has waited this long.
    "PROMESA_BACKLOG_ALERT_MINUTES": 10,
    # /metrics: answers only to this bearer token when set, else only to loopback clients.
    "PROMESA_METRICS_TOKEN": "",
    # /metrics: this many subscriptions get series of their own; the rest are summed as "other".
    "PROMESA_METRICS_SUBSCRIPTION_LABELS": 50,
    # Retention (dashboard/retention.py): succeeded deliveries, and dead letters not replayed, in days.
    "PROMESA_RETENTION_DAYS": 30,
    "PROMESA_DEAD_RETENTION_DAYS": 90,
    # Pruning: deliveries per batch (one short transaction), batches of each kind per sweeper pass, and
    # the rest after each batch as a multiple of the time it took (3: the pruner takes at most a quarter of
    # the time it could; at 1 delivery ran at 0.75 of its rate during a 1,000,000-row prune, at 3 at 0.92).
    "PROMESA_PRUNE_BATCH": 500,
    "PROMESA_PRUNE_BATCHES_PER_PASS": 100,
    "PROMESA_PRUNE_PAUSE_RATIO": 3.0,
}
