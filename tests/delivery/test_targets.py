"""Where a webhook may go: the address filter, the URL check at creation, the connector's resolver,
and its socket factory.

The resolver is handed address literals, which resolve without a lookup; the only traffic is to the
test's own receiver on 127.0.0.1, which a host spelled another way must not reach."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.delivery.http import _private_literal
from dashboard.delivery.targets import PublicOnlyResolver, is_public, url_problem
from dashboard.models import Attempt

from tests.support.pipeline import deliver_due

# IPv6 spellings of IPv4 addresses: the embedded IPv4 address decides.
EMBEDDING_PRIVATE = [
    "64:ff9b::a9fe:a9fe",        # NAT64 well-known prefix: 169.254.169.254, the metadata address
    "64:ff9b::7f00:1",           # NAT64: 127.0.0.1
    "64:ff9b::a00:1",            # NAT64: 10.0.0.1
    "64:ff9b:1::a9fe:a9fe",      # RFC 8215 local-use NAT64: never global
    "2002:a9fe:a9fe::1",         # 6to4: 169.254.169.254
    "2002:7f00:1::",             # 6to4: 127.0.0.1
    "::169.254.169.254",         # IPv4-compatible
    "::10.0.0.1",
    "::ffff:0:169.254.169.254",  # IPv4-translated (SIIT)
    "::ffff:0:7f00:1",
    "::ffff:169.254.169.254",    # IPv4-mapped
]
EMBEDDING_PUBLIC = ["64:ff9b::808:808", "2002:808:808::1", "::ffff:0:8.8.8.8", "2606:4700:4700::1111", "8.8.8.8"]


@pytest.mark.parametrize("address", EMBEDDING_PRIVATE)
def test_an_ipv6_address_embedding_a_private_ipv4_address_is_private(address):
    assert not is_public(address)
    assert "private address" in url_problem(f"http://[{address}]/hook", allow_private=False)
    assert _private_literal(f"https://[{address}]:8443/hook")


@pytest.mark.parametrize("address", EMBEDDING_PUBLIC)
def test_an_ipv6_address_embedding_a_public_ipv4_address_is_public(address):
    assert is_public(address)
    host = f"[{address}]" if ":" in address else address
    assert url_problem(f"http://{host}/hook", allow_private=False) is None
    assert not _private_literal(f"http://{host}/hook")


def _resolve(host: str, family=socket.AF_UNSPEC):
    async def go():
        resolver = PublicOnlyResolver()
        try:
            return await resolver.resolve(host, 443, family=family)
        finally:
            await resolver.close()

    return asyncio.run(go())


@pytest.mark.parametrize("address", EMBEDDING_PRIVATE)
def test_the_connectors_resolver_refuses_embedded_private_addresses(address):
    with pytest.raises(OSError, match="only to private addresses"):
        _resolve(address, socket.AF_INET6)


def test_the_connectors_resolver_keeps_embedded_public_addresses():
    [found] = _resolve("64:ff9b::808:808", socket.AF_INET6)
    assert found["host"] == "64:ff9b::808:808"


@pytest.mark.parametrize("url, words", [
    ("http://[::1/hook", "cannot be parsed"),                 # a broken IPv6 literal
    ("http://[zz]/hook", "cannot be parsed"),
    ("http://[::1]x/hook", "cannot be parsed"),
    ("http://\u2100.example/hook", "cannot be parsed"),       # NFKC turns the host into a/c
    ("http://" + "a" * 64 + ".example/", "IDNA"),             # a label over 63 characters
    ("http://a..b/hook", "IDNA"),                             # an empty label
    ("http://ex\u00adample.com/", "cannot contain"),          # a soft hyphen the HTTP client refuses
    ("http://\udcff.example/", "surrogates"),
    ("http://example.com/a\x00b", "control characters"),
    ("http://example.com:99999/", "cannot be parsed"),
])
def test_urls_no_client_could_deliver_to_are_refused_even_where_private_targets_are_allowed(url, words):
    assert words in url_problem(url, allow_private=True)


# 127.0.0.1 as the HTTP client rewrites it (IDNA mapping, NFKC): fullwidth digits, circled digits, ideographic dots.
LOOPBACK_SPELLED_OTHERWISE = ["\uff11\uff12\uff17.\uff10.\uff10.\uff11", "\u2460\u2461\u2466.\u24ea.\u24ea.\u2460",
                              "127\u30020\u30020\u30021"]


@pytest.mark.parametrize("host", LOOPBACK_SPELLED_OTHERWISE)
def test_a_host_is_judged_as_the_http_client_will_spell_it(host):
    # Without a lookup (resolve=False) only the spelling the client connects to can tell.
    assert "private address" in url_problem(f"http://{host}:8080/hook", allow_private=False, resolve=False)


def test_a_private_address_is_refused_without_saying_which_one():
    problem = url_problem("http://localhost/hook", allow_private=False)  # the name, not the address, is the caller's
    assert "not allowed" in problem and "localhost" in problem
    assert "127.0.0.1" not in problem and "::1" not in problem


def test_a_loopback_host_spelled_otherwise_is_refused_at_creation_and_when_sending(app, producer, receiver, clock):
    port = receiver.url.rsplit(":", 1)[1]
    urls = [f"http://{host}:{port}/hook" for host in LOOPBACK_SPELLED_OTHERWISE]
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    try:
        for url in urls:
            refused = producer.post("/api/v1/subscriptions", {"url": url})
            assert refused.status_code == 422, refused.get_json()
            assert "not allowed" in refused.get_json()["error"] and "(127.0.0.1)" not in refused.get_json()["error"]
        app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = True  # saved while private targets were allowed
        for url in urls:
            producer.subscribe(url)
        producer.publish()
        app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
        deliver_due(app, clock, rounds=1)
    finally:
        app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = True
    attempts = db.session.scalars(select(Attempt)).all()
    assert len(attempts) == len(urls)
    for attempt in attempts:
        assert attempt.status_code is None and "private address refused" in attempt.error, attempt.error
    assert receiver.count() == 0
