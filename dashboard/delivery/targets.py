"""Where a webhook may be sent. Unless PROMESA_ALLOW_PRIVATE_TARGETS is set, an endpoint
must resolve to public addresses only, so a subscription cannot be aimed at our own network.
Checked when a subscription is saved and again on every connection (DNS can change)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import aiohttp


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return ip.is_global and not ip.is_multicast


def url_problem(url: str, allow_private: bool, resolve: bool = True) -> str | None:
    """Why this URL cannot be a webhook endpoint, or None when it can."""
    if not isinstance(url, str) or not url.strip():
        return "url must be a non-empty string"
    if len(url) > 2048:
        return "url is longer than 2048 characters"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "url must start with http:// or https://"
    if not parts.hostname:
        return "url has no host"
    if parts.username or parts.password:
        return "url must not carry credentials"
    try:
        parts.port
    except ValueError:
        return "url has an invalid port"
    if allow_private:
        return None
    host = parts.hostname
    try:
        addresses = [host] if _is_ip(host) else _resolve(host) if resolve else []
    except OSError:
        return f"host {host!r} does not resolve"
    for address in addresses:
        if not is_public(address):
            return f"host {host!r} is a private address ({address}); set PROMESA_ALLOW_PRIVATE_TARGETS to allow it"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _resolve(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})


class PublicOnlyResolver(aiohttp.ThreadedResolver):
    """Drops private addresses from every lookup, so DNS cannot steer a delivery inward."""

    async def resolve(self, host, port=0, family=socket.AF_INET):
        hosts = await super().resolve(host, port, family)
        public = [h for h in hosts if is_public(h["host"])]
        if not public:
            raise OSError(f"{host} resolves only to private addresses")
        return public
