"""Where a webhook may go: the address filter, the URL check at creation, and the connector's resolver.

Nothing here sends traffic: the resolver is handed address literals, which resolve without a lookup."""

from __future__ import annotations

import asyncio
import socket

import pytest

from dashboard.delivery.http import _private_literal
from dashboard.delivery.targets import PublicOnlyResolver, is_public, url_problem

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
