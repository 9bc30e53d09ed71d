"""Fetching http(s) image URLs for `serve --allow-image-urls` without becoming a proxy into the network.

Each hop's host is resolved once here and every address it resolves to must be public: loopback,
private, link-local, multicast, reserved and unspecified addresses are refused, however they are
written (`2130706433`, `0177.0.0.1` and `0x7f.1` all resolve to 127.0.0.1 first). The connection then
goes to the address that was checked, not to a second lookup (no DNS rebinding between check and use),
and redirects are followed by hand so that every hop is checked the same way.

Every failure — a refused address, a closed port, a timeout, a 404, a body over the limit — is the same
one sentence, so the server cannot be used to map what listens where.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

import httpx

from qvl_agent.server.protocol import ApiError

MAX_REDIRECTS = 5
FETCH_TIMEOUT_S = 10.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# IPv6 prefixes that carry an IPv4 address in their last 32 bits, which a translator (NAT64, SIIT) or the
# kernel (IPv4-compatible ::a.b.c.d) may deliver to that IPv4 address: on an IPv6-only network with NAT64,
# 64:ff9b::a00:1 reaches 10.0.0.1.
_IPV4_IN_LOW_BITS = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "::ffff:0:0:0/96", "::/96"))


def is_public(address: Address, port: int) -> bool:
    """Whether the server may connect to `address` on behalf of a client: a global address, and for an IPv6
    address that embeds an IPv4 one (mapped, NAT64, 6to4, IPv4-compatible), a global IPv4 address too."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_site_local:  # deprecated, but still routed inside some sites
            return False
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and any(address in net for net in _IPV4_IN_LOW_BITS):
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            address = embedded
    return address.is_global and not address.is_multicast


class FetchRefused(Exception):
    pass


class ImageFetcher:
    """Downloads one image of at most `limit` bytes; `allow(address, port)` decides where it may go."""

    def __init__(self, limit: int, allow: Callable[[Address, int], bool] = is_public):
        self.limit = limit
        self.allow = allow

    def fetch(self, url: str, param: str) -> bytes:
        try:
            return self._follow(url)
        except (FetchRefused, httpx.HTTPError, OSError, ValueError, UnicodeError):
            raise ApiError(
                400,
                "Could not fetch the image at that URL (it must be a public http(s) address that answers "
                f"with an image of at most {self.limit:,} bytes).",
                param=param,
                code="image_fetch_failed",
            ) from None

    def _follow(self, url: str) -> bytes:
        with httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                parts = urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise FetchRefused(url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                address = self._checked_address(parts.hostname, port)
                host = f"[{address}]" if address.version == 6 else str(address)
                pinned = parts._replace(netloc=f"{host}:{port}").geturl()
                request = client.build_request(
                    "GET",
                    pinned,
                    headers={"Host": parts.netloc.rpartition("@")[2]},
                    extensions={"sni_hostname": parts.hostname},
                )
                response = client.send(request, stream=True)
                try:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    response.raise_for_status()
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > self.limit:
                            raise FetchRefused(url)
                    return bytes(data)
                finally:
                    response.close()
        raise FetchRefused(url)

    def _checked_address(self, hostname: str, port: int) -> Address:
        """The first address `hostname` resolves to, when every one of them is allowed."""
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        if not addresses or not all(self.allow(a, port) for a in addresses):
            raise FetchRefused(hostname)
        return addresses[0]
