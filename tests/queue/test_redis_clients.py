"""REDIS_URL read into a client: a server's address, or a Sentinel group's (`redis+sentinel://`); copies with
a pool of their own; and the name `promesa status` shows, never with a password. Nothing here connects: the
failover itself is tests/faults/test_redis_sentinel.py."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from dashboard.queue import clients
from dashboard.queue.work import client_options

GROUP = "redis+sentinel://:s3cret-pw@10.0.0.1:26380,10.0.0.2/mymaster/2"


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    group = clients.sentinel_group(GROUP + "?health_check_interval=5")
    assert group.sentinels == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]  # the sentinels' own port when left out
    assert group.service_name == "mymaster"
    assert group.options == {"password": "s3cret-pw", "db": 2, "health_check_interval": 5}
    assert clients.sentinel_group("redis+sentinel://[::1]:26379/other").sentinels == [("::1", 26379)]
    assert "db" not in clients.sentinel_group("redis+sentinel://a:1/svc").options


def test_a_client_of_a_group_asks_its_sentinels_with_the_same_timeouts_and_never_twice():
    conn = clients.from_url(GROUP, **client_options(3.0))
    pool = conn.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.is_master and pool.service_name == "mymaster"
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"], kwargs["retry"]) == (2, "s3cret-pw", 3.0, None)
    asked = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in asked] == [26380, 26379]
    first = asked[0].connection_pool.connection_kwargs
    assert (first["socket_timeout"], first["socket_connect_timeout"], first["password"]) == (3.0, 3.0, "s3cret-pw")
    assert first["retry"].get_retries() == 0
    # Options written in the URL win, as in a redis:// URL.
    assert clients.from_url(GROUP + "?socket_timeout=0.5", **client_options(3.0)) \
        .connection_pool.connection_kwargs["socket_timeout"] == 0.5


def test_a_copy_of_a_group_client_has_a_pool_of_its_own_on_the_same_sentinels():
    conn = clients.from_url(GROUP, **client_options(3.0))
    copy = clients.clone(conn, socket_timeout=1.0)
    pool, copied = conn.connection_pool, copy.connection_pool
    assert isinstance(copied, SentinelConnectionPool) and copied is not pool
    assert copied.sentinel_manager is pool.sentinel_manager and copied.service_name == "mymaster"
    assert copied.connection_kwargs["connection_pool"] is copied.proxy  # its own link, not the original's
    assert (copied.connection_kwargs["socket_timeout"], pool.connection_kwargs["socket_timeout"]) == (1.0, 3.0)


def test_where_a_client_points_never_shows_a_password():
    assert clients.where(clients.from_url(GROUP)) == "sentinel service mymaster"  # no master asked yet
    assert clients.where(clients.from_url("redis://:s3cret-pw@10.0.0.3:6380/1")) == "10.0.0.3:6380"
    assert clients.where(clients.from_url("unix:///run/redis.sock")) == "unix socket /run/redis.sock"


@pytest.mark.parametrize("url, words", [
    ("redis+sentinel://:s3cret-pw@/mymaster", "names no sentinel"),
    ("redis+sentinel://:s3cret-pw@a:26379", "names no Sentinel service"),
    ("redis+sentinel://:s3cret-pw@a:26379/", "names no Sentinel service"),
    ("redis+sentinel://:s3cret-pw@a:port/mymaster", "sentinel 'a:port' is not host:port"),
    ("redis+sentinel://:s3cret-pw@a:99999/mymaster", "sentinel 'a:99999' is not host:port"),
    ("redis+sentinel://:s3cret-pw@a/mymaster/zero", "not a database number"),
    ("redis+sentinel://:s3cret-pw@a/mymaster/0/1", "not a database number"),
    ("redis+sentinel://:s3cret-pw@a/mymaster?socket_timeout=soon", "Invalid value for 'socket_timeout'"),
    ("http://:s3cret-pw@a:6379/0", "must specify one of the following schemes"),
])
def test_a_url_that_cannot_be_read_says_why_without_repeating_it(url, words):
    problem = clients.url_problem(url)
    assert words in problem and "s3cret-pw" not in problem
    with pytest.raises(clients.BadRedisUrl):
        clients.from_url(url)


def test_readable_urls_have_no_problem():
    for url in (None, "", GROUP, "redis://127.0.0.1:6379/0", "unix:///run/redis.sock", "rediss://h:6380"):
        assert clients.url_problem(url) is None
