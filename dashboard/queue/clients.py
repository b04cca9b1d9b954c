"""Redis clients: made from REDIS_URL, copied with a connection pool of their own, and named without a secret.

REDIS_URL is a server's address (`redis://`, `rediss://`, `unix://`, as redis-py reads it) or a Sentinel group's:
`redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db][?option=value...]`. A client of a
group asks the sentinels for the service's master before each new connection, so after a failover its next
connection goes to the promoted replica; a connection still open to the old master fails like any Redis that
went away (a demoted master's READONLY answer too), and whoever made the call waits Redis out as for an outage.
The credentials are the master's and the sentinels' both, and the query string means what it means in a
`redis://` URL (the `limits` library reads the same form, with no /db).
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
SENTINEL_FORM = f"{SENTINEL_SCHEME}://host:port[,host:port]/service_name[/db]"


class BadRedisUrl(ValueError):
    """REDIS_URL cannot be read; the message says why and never repeats the URL (it may hold a password)."""


class SentinelGroup(NamedTuple):
    sentinels: list[tuple[str, int]]
    service_name: str
    options: dict  # the master's connection options: db, credentials, the query string's


def sentinel_group(url: str) -> SentinelGroup:
    """What a `redis+sentinel://` URL names. Raises BadRedisUrl."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = [_sentinel_address(host) for host in hosts.split(",") if host]
    if not sentinels:
        raise BadRedisUrl(f"REDIS_URL names no sentinel: the form is {SENTINEL_FORM}")
    service_name, *rest = unquote(parts.path).strip("/").split("/") if parts.path.strip("/") else ("",)
    if not service_name:
        raise BadRedisUrl(f"REDIS_URL names no Sentinel service: the form is {SENTINEL_FORM}")
    if len(rest) > 1 or (rest and not rest[0].isdigit()):
        raise BadRedisUrl(f"REDIS_URL's path after the service name is not a database number: the form is {SENTINEL_FORM}")
    # The credentials and the query string read as redis-py reads them in a redis:// URL.
    options = _url_options(f"redis://{userinfo + '@' if userinfo else ''}sentinels/?{parts.query}")
    options.pop("host", None)
    if rest and "db" not in options:
        options["db"] = int(rest[0])
    return SentinelGroup(sentinels, service_name, options)


def _sentinel_address(host: str) -> tuple[str, int]:
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not colon:
        name, port = host, str(SENTINEL_PORT)
    if not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadRedisUrl(f"REDIS_URL's sentinel {host!r} is not host:port: the form is {SENTINEL_FORM}")
    return name.strip("[]"), int(port)


def _url_options(url: str) -> dict:
    try:
        return redis.connection.parse_url(url)
    except ValueError as error:
        raise BadRedisUrl(f"REDIS_URL: {error}") from None


def url_problem(url: str | None) -> str | None:
    """What is wrong with REDIS_URL (unset is the embedded server's: nothing), or None; nothing is connected."""
    if not url:
        return None
    try:
        sentinel_group(url) if is_sentinel_url(url) else _url_options(url)
    except BadRedisUrl as error:
        return str(error)
    return None


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith(f"{SENTINEL_SCHEME}://")


def from_url(url: str, **options) -> redis.Redis:
    """A client of the server REDIS_URL names, or of its Sentinel group's master; options in the URL win over
    `options` (as in redis.Redis.from_url). The sentinels are asked with the same timeouts, never retried."""
    if not is_sentinel_url(url):
        _url_options(url)  # a clear error now rather than a connection's later
        return redis.Redis.from_url(url, **options)
    group = sentinel_group(url)
    master_options = {**options, **group.options}
    asking = {k: v for k, v in master_options.items() if k.startswith("socket_") or k in ("username", "password")}
    return Sentinel(group.sentinels, sentinel_kwargs=asking).master_for(group.service_name, **master_options)


def clone(conn: redis.Redis, **options) -> redis.Redis:
    """A client of the same server (or the same group's master) with a connection pool of its own; `options`
    replace the original's (timeouts)."""
    pool = conn.connection_pool
    kwargs = {**pool.connection_kwargs, **options}
    if isinstance(pool, SentinelConnectionPool):
        del kwargs["connection_pool"]  # the original pool's link to the sentinels: the copy makes its own
        copy = type(pool)(pool.service_name, pool.sentinel_manager, is_master=pool.is_master,
                          check_connection=pool.check_connection, connection_class=pool.connection_class, **kwargs)
    else:
        copy = type(pool)(connection_class=pool.connection_class, **kwargs)
    return redis.Redis(connection_pool=copy)


def where(conn: redis.Redis) -> str:
    """The server a client talks to, for people: host:port, a socket, or a Sentinel service and the master it
    last found (never a credential)."""
    pool = conn.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        master = pool.master_address
        return f"sentinel service {pool.service_name}" + (f", master {master[0]}:{master[1]}" if master else "")
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix socket {kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
