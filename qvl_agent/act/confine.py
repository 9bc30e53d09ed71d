"""While a secret is declared, the whole browser reaches the allowed hosts and nothing else.

`HostProxy(hosts)` is an HTTP proxy on 127.0.0.1 that Chromium is launched behind (`--proxy-server`, with
loopback not bypassed and WebRTC kept to proxied connections). Every connection Chromium makes for any of
its targets — pages, frames, popups, dedicated, shared and service workers, WebSockets, beacons,
prefetches — comes here first, as a `CONNECT host:port` tunnel (https, wss) or a request for an
`http://` URL. A host outside `hosts` (the start URL's and `--allow-domain`'s, with their subdomains) is
answered 403 and never connected to; the proxy resolves names itself, so the page's DNS lookups go nowhere
else either. It never looks at what a request carries: no spelling of a secret matters, because nothing
reaches another host at all. The network guard's route (`netguard.py`) stays as a second line.

Connections are relayed as bytes (TLS stays end to end). A plain-http request is sent upstream with
`Connection: close`, so each proxied http connection serves one host. At most `MAX_CONNECTIONS` at once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

from qvl_agent.act.netguard import allowed_host

MAX_HEAD = 64 << 10  # a request head larger than this is refused
MAX_CONNECTIONS = 256
CONNECT_TIMEOUT_S = 15


class HostProxy:
    def __init__(self, hosts: tuple[str, ...]):
        self.hosts = tuple(h.lower().rstrip(".") for h in hosts if h)
        self.refused: list[str] = []  # hosts refused, for the model's next observation (taken by the executor)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._open: set[socket.socket] = set()

    def start(self) -> HostProxy:
        threading.Thread(target=self._accept, name="qvl-host-proxy", daemon=True).start()
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.close()

    def take_refused(self) -> list[str]:
        with self._lock:
            hosts, self.refused = self.refused, []
        return hosts

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()  # past the cap: Chromium retries or fails that one request
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = None
        try:
            self._track(conn)
            head = _read_head(conn)
            if head is None:
                return
            method, target, rest = _request_line(head)
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                host = host.strip("[]")
            else:
                parts = urlsplit(target)
                host, port = parts.hostname or "", str(parts.port or 80)
                if parts.scheme != "http":
                    host = ""
            if not host or not port.isdigit() or not allowed_host(host, self.hosts):
                with self._lock:
                    self.refused.append(host or "an address it could not name")
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            upstream = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
            upstream.settimeout(None)
            self._track(upstream)
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(rest)
            else:
                upstream.sendall(_origin_form(head, target) + rest)
            _relay(conn, upstream)
        except OSError:
            pass
        finally:
            for sock in (conn, upstream):
                if sock is not None:
                    self._untrack(sock)
                    with contextlib.suppress(OSError):
                        sock.close()
            self._slots.release()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)


def _read_head(conn: socket.socket) -> bytes | None:
    """The request head and whatever followed it in the same reads, or None (closed, or too large)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(16384)
        if not chunk or len(data) + len(chunk) > MAX_HEAD:
            return None
        data += chunk
    return data


def _request_line(data: bytes) -> tuple[str, str, bytes]:
    """(method, target, the bytes after the head)."""
    head, _, rest = data.partition(b"\r\n\r\n")
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    method, _, remainder = line.partition(" ")
    return method.upper(), remainder.rpartition(" ")[0], rest


def _origin_form(data: bytes, target: str) -> bytes:
    """A proxied request's head for the origin server: the path instead of the URL, one request per
    connection, no proxy headers."""
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    method, _, rest = head[0].partition(" ")
    version = rest.rpartition(" ")[2]
    parts = urlsplit(target)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    drop = ("proxy-connection", "connection", "keep-alive", "proxy-authorization")
    fields = [line for line in head[1:] if line.split(":", 1)[0].strip().lower() not in drop]
    return "\r\n".join([f"{method} {path} {version}", *fields, "Connection: close", "", ""]).encode("latin-1")


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until either side closes."""

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join()
