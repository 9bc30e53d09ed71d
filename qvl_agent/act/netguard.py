"""The browser executor's network guard: which requests of a run may leave the browser.

Installed as a route on the whole browser context (every page and tab; service workers are blocked so
none can go around it) when a run has --allow-domain hosts, secrets, or must not reach local addresses:

  - a request whose URL, headers or body carries a secret's value (`Secrets.carried_by`: raw,
    percent-encoded, form-encoded, base64) goes only to the start URL's host and the --allow-domain hosts;
  - with --allow-domain, a navigation (a page or frame load) goes only to those hosts;
  - with `block_local` (the MCP server's default), nothing goes to localhost, a loopback, private,
    link-local or unspecified IP address.

Playwright's routes never see the hops of a redirect: the browser follows a 3xx by itself. So a request
the guard checks is fetched by the guard one hop at a time (`route.fetch(max_redirects=0)`): a redirect
whose next hop would break a rule is refused; one whose next hop carries no secret is handed back to
the browser to follow (a later hop of a navigation is checked where the page lands, `BrowserExecutor`);
a hop that still carries a secret (a 307/308 re-post, a URL holding it) is fetched by the guard itself,
each hop checked, and the browser gets the final answer. Refusals are kept in `blocked` as sentences for
the model's next observation; a refused request is aborted as "blocked by client".

Not covered here: WebSocket and WebRTC traffic, DNS lookups (a prefetch of a name), a host name that
resolves to a local address. This guard recognises; with a secret declared, the wall is below the page:
the whole browser runs behind `confine.HostProxy`, which connects the allowed hosts and nothing else.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

from qvl_agent.secrets import Secrets

__all__ = ["NetworkGuard", "allowed_host", "is_local_host", "local_target"]

MAX_HOPS = 10
REDIRECTS = {301, 302, 303, 307, 308}


def allowed_host(host: str, domains: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in domains)


def is_local_host(host: str) -> bool:
    """localhost, or an IP address that is loopback, private, link-local, reserved or unspecified."""
    host = host.lower().rstrip(".").strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified


def local_target(url: str) -> str:
    """What makes `url` local ("" when nothing does): a file:// URL, or a host that is, or resolves to, a
    local address. For the MCP server, whose caller is a model that a page may have talked into asking."""
    scheme = url.split(":", 1)[0].lower()
    if scheme not in ("http", "https"):
        return f"a {scheme}: URL"
    host = _host(url)
    if is_local_host(host):
        return f"the local address {host}"
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return ""  # does not resolve: the browser says so
    for address in sorted(addresses):
        if is_local_host(address.split("%", 1)[0]):
            return f"{host}, which resolves to the local address {address}"
    return ""


def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


class NetworkGuard:
    def __init__(
        self, start_url: str, allowed_domains: tuple[str, ...], secrets: Secrets | None, block_local: bool = False
    ):
        start = _host(start_url)
        self.navigation_domains = tuple(allowed_domains) + ((start,) if allowed_domains and start else ())
        self.secret_domains = tuple(allowed_domains) + ((start,) if start else ())
        self.secrets = secrets or Secrets()
        self.block_local = block_local
        self.blocked: list[str] = []  # sentences for the model, taken by the executor
        self.refused_navigations: list[str] = []  # hosts a page load was refused to, taken by the executor

    @property
    def active(self) -> bool:
        return bool(self.navigation_domains or self.secrets or self.block_local)

    def _carries(self, url: str, headers: dict | None, body: bytes | None) -> bool:
        if not self.secrets:
            return False
        values = " ".join(headers.values()) if headers else ""
        return bool(self.secrets.carried_by(url) or self.secrets.carried_by(values) or self.secrets.carried_by(body))

    def refusal(self, url: str, navigation: bool, carries: bool) -> str:
        """Why a request to `url` may not be sent ("" when it may)."""
        host = _host(url)
        if self.block_local and is_local_host(host):
            return f"the page tried to reach the local address {host}: that was blocked"
        if carries and not allowed_host(host, self.secret_domains):
            return f"the page tried to send a secret to {host}, which is not an allowed domain: that was blocked"
        if navigation and self.navigation_domains and not allowed_host(host, self.navigation_domains):
            return f"the page tried to open {host}, which is not an allowed domain: that was blocked"
        return ""

    def handle(self, route) -> None:
        """The context route: let a request through, refuse it, or walk its redirects (module docstring)."""
        request = route.request
        url = request.url
        if not url.startswith(("http:", "https:")):
            route.fallback()
            return
        navigation = request.is_navigation_request()
        headers = request.headers
        body = request.post_data_buffer
        carries = self._carries(url, headers, body)
        why = self.refusal(url, navigation, carries)
        if why:
            self._refuse(route, why, url if navigation else None)
            return
        follow = carries or (navigation and bool(self.navigation_domains))
        if not follow:
            route.fallback()
            return
        method = request.method
        response = self._fetch(route, max_redirects=0)
        for _ in range(MAX_HOPS):
            if response is None:
                return
            location = response.headers.get("location") if response.status in REDIRECTS else None
            if not location:
                route.fulfill(response=response)
                return
            next_url = urljoin(url, location)
            if response.status in (307, 308):
                pass  # the same method and body go on
            elif response.status == 303 or method == "POST":
                method, body = "GET", None
                headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-length")}
            carries = self._carries(next_url, headers, body)
            why = self.refusal(next_url, navigation, carries)
            if why:
                self._refuse(route, why, next_url if navigation else None)
                return
            if not carries:  # nothing secret goes on: the browser follows this redirect itself
                route.fulfill(response=response)
                return
            url = next_url
            response = self._fetch(route, url=url, method=method, headers=headers, post_data=body, max_redirects=0)
        self._refuse(route, f"the page redirected more than {MAX_HOPS} times with a secret: that was blocked")

    @staticmethod
    def _fetch(route, **kwargs):
        """The hop's response, or None when it could not be fetched (the request then fails as a dead
        server's would, and the executor reports the page as it does for any failed load)."""
        try:
            return route.fetch(**kwargs)
        except Exception:  # Playwright's Error, a closed browser: the route must answer either way
            try:
                route.abort("failed")
            except Exception:
                pass
            return None

    def _refuse(self, route, why: str, navigation_url: str | None = None) -> None:
        if why not in self.blocked:
            self.blocked.append(why)
        if navigation_url is not None:  # the action that led there had no effect: an export leaves it out
            self.refused_navigations.append(_host(navigation_url))
        route.abort("blockedbyclient")
