"""Where a webhook may be sent. Unless PROMESA_ALLOW_PRIVATE_TARGETS is set, an endpoint
must resolve to public addresses only, so a subscription cannot be aimed at our own network.
Checked when a subscription is saved, on the host as the HTTP client will spell it, and again on
every connection, on the address the socket is about to connect to (DNS can change, and a host
written `１２７.０.０.１` is rewritten to 127.0.0.1 after any check of its spelling)."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from urllib.parse import urlsplit

import aiohttp
import yarl

_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f\ud800-\udfff]")

# IPv6 prefixes whose addresses carry an IPv4 address that a gateway or the host's own stack
# may connect to: the embedded IPv4 address is what is judged.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix: the last 32 bits
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d: the last 32 bits
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT ::ffff:0:a.b.c.d: the last 32 bits
# RFC 8215 local-use NAT64: the IPv4 address may sit at any of several offsets, and it is never global.
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4, compatible, translated), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _IPV4_COMPATIBLE or ip in _IPV4_TRANSLATED:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _LOCAL_NAT64:
            return False
        inner = embedded_ipv4(ip)
        if inner is not None:
            ip = inner
    return ip.is_global and not ip.is_multicast


def url_problem(url: str, allow_private: bool, resolve: bool = True) -> str | None:
    """Why this URL cannot be a webhook endpoint, or None when it can."""
    if not isinstance(url, str) or not url.strip():
        return "url must be a non-empty string"
    if len(url) > 2048:
        return "url is longer than 2048 characters"
    if _SPACE_OR_CONTROL.search(url):
        return "url must not contain spaces, control characters or unpaired surrogates"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port
        # The HTTP client parses it so: a URL it refuses could never be delivered, and the host it
        # connects to is this one (IDNA, NFKC: fullwidth or circled digits become an IP address).
        connected_host = yarl.URL(url).raw_host
    except ValueError as exc:  # a broken IPv6 literal, a port out of range, a host NFKC refuses
        return f"url cannot be parsed: {exc}"
    if parts.scheme not in ("http", "https"):
        return "url must start with http:// or https://"
    if not host:
        return "url has no host"
    if parts.username or parts.password:
        return "url must not carry credentials"
    if not _is_ip(host):
        try:
            host.encode("idna")
        except UnicodeError:
            return f"url has a host name that IDNA cannot encode: {host!r}"
    if allow_private:
        return None
    connected_host = connected_host or host
    try:
        addresses = [connected_host] if _is_ip(connected_host) else _resolve(connected_host) if resolve else []
    except (OSError, UnicodeError):
        return f"host {host!r} does not resolve"
    # Which private address it is stays unsaid: the answer of our DNS is no one else's business.
    if any(not is_public(address) for address in addresses):
        return f"host {host!r} is a private address, which is not allowed; set PROMESA_ALLOW_PRIVATE_TARGETS to allow it"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _resolve(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})


PRIVATE_REFUSED = "private address refused"


def public_socket(addr_info) -> socket.socket:
    """The connector's socket factory: the last word on where a connection goes, whatever the
    resolver was asked and however the host was written (aiohttp connects to an IP literal without
    asking the resolver)."""
    family, type_, proto, _, sockaddr = addr_info
    if not is_public(sockaddr[0]):
        raise OSError(errno.EACCES, f"{PRIVATE_REFUSED} (PROMESA_ALLOW_PRIVATE_TARGETS is off)")
    return socket.socket(family=family, type=type_, proto=proto)


class PublicOnlyResolver(aiohttp.ThreadedResolver):
    """Drops private addresses from every lookup, so DNS cannot steer a delivery inward."""

    async def resolve(self, host, port=0, family=socket.AF_INET):
        hosts = await super().resolve(host, port, family)
        public = [h for h in hosts if is_public(h["host"])]
        if not public:
            raise OSError(f"{host} resolves only to private addresses")
        return public
