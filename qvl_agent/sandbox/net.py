"""The sandbox's network: the host side of its relays (see `bubblewrap.py`, **Network**).

`inside_addresses(targets)` says where each origin's relay listens inside the sandbox and writes the
sandbox's /etc/hosts; `Forwarder` is the one way out: per origin a unix socket bound into the sandbox
whose every connection is relayed to that origin's address, resolved once before the run, and nowhere
else, all served by one thread, with caps on connections and origins.
"""

from __future__ import annotations

import contextlib
import ipaddress
import selectors
import socket
import threading
from pathlib import Path

from qvl_agent.errors import SandboxUnavailable

MAX_CONNECTIONS = 64  # open connections out of one sandbox at once, all origins together
MAX_ORIGINS = 64  # origins one sandbox may reach
BUFFER = 256 << 10  # bytes held per direction of one connection before its sender is no longer read


def port_of(target) -> int:
    return target.port or (443 if target.scheme == "https" else 80)


def inside_addresses(targets: list) -> tuple[list[str], str]:
    """Where each target's relay listens inside, and the sandbox's /etc/hosts. A loopback address listens
    as itself; each host name gets a loopback address of its own (127.0.1.N: the sandbox's loopback
    interface holds all of 127.0.0.0/8), so two names on the same port do not collide."""
    listens: list[str] = []
    names: dict[str, str] = {}
    for target in targets:
        host = target.hostname or ""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            if host == "localhost":
                names.setdefault(host, "127.0.0.1")
            names.setdefault(host, f"127.0.1.{len(names) + 1}")
            listens.append(names[host])
            continue
        if not address.is_loopback:
            raise SandboxUnavailable(
                f"A sandboxed script can reach a page by host name or a loopback address, not by the address {host}."
            )
        listens.append(str(address))
    if len(names) > 250:
        raise SandboxUnavailable("A sandboxed script can reach at most 250 host names.")
    lines = ["127.0.0.1 localhost"] + [f"{address} {name}" for name, address in names.items() if name != "localhost"]
    return listens, "\n".join(lines) + "\n"


class Forwarder:
    """The sandbox's ways out, one unix socket per origin (`path_of(n)`, bound into the sandbox), every
    connection relayed to that origin's address and nowhere else, all of them served by one thread with a
    selector: the script's connections cost this process no thread each. At most MAX_CONNECTIONS open at
    once for the whole sandbox (more wait in the listen queue, then fail), at most MAX_ORIGINS origins."""

    def __init__(self, folder: Path, targets: list) -> None:
        if len(targets) > MAX_ORIGINS:
            raise SandboxUnavailable(f"A sandboxed script can reach at most {MAX_ORIGINS} origins, not {len(targets)}.")
        self.paths: list[Path] = []
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._pairs: set[_Pair] = set()
        self._thread = threading.Thread(target=self._run, name="qvl-sandbox-forwarder", daemon=True)
        self._stopped = False
        for n, target in enumerate(targets):
            port = port_of(target)
            # Resolved once, now: the sandbox cannot steer a later lookup elsewhere. A name that does not
            # resolve leaves no address: the script's connections then fail, and its own error says so.
            try:
                found = socket.getaddrinfo(target.hostname, port, type=socket.SOCK_STREAM)
            except OSError:
                found = []
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(folder / f"net{n}.sock"))
            listener.listen(MAX_CONNECTIONS)
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ, [(info[0], info[4]) for info in found])
            self.paths.append(folder / f"net{n}.sock")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close every listener and connection; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        for pair in self._pairs:
            pair.close()
        for key in list(self._selector.get_map().values()):
            _close(key.fileobj)
        self._selector.close()
        self._wake_write.close()

    def _run(self) -> None:
        while not self._stopped:
            for key, events in self._selector.select(timeout=1.0):
                if key.fileobj is self._wake_read:
                    return
                if isinstance(key.data, list):
                    self._accept(key.fileobj, key.data)
                else:
                    key.data.ready(key.fileobj, events)
            for pair in [p for p in self._pairs if p.done]:
                pair.close()
                self._pairs.discard(pair)

    def _accept(self, listener: socket.socket, addresses: list) -> None:
        try:
            inside, _ = listener.accept()
        except OSError:
            return
        if len(self._pairs) >= MAX_CONNECTIONS or not addresses:
            inside.close()
            return
        family, address = addresses[0]
        outside = socket.socket(family, socket.SOCK_STREAM)
        outside.setblocking(False)
        inside.setblocking(False)
        outside.connect_ex(address)
        self._pairs.add(_Pair(self._selector, inside, outside))


class _Pair:
    """One connection through the forwarder: bytes both ways, at most BUFFER bytes held per direction."""

    def __init__(self, selector: selectors.BaseSelector, inside: socket.socket, outside: socket.socket) -> None:
        self.selector = selector
        self.inside, self.outside = inside, outside
        self.pending = {inside: bytearray(), outside: bytearray()}  # what waits to be sent TO that socket
        self.eof = {inside: False, outside: False}  # that socket will send nothing more
        self.connected = False
        self.done = False
        selector.register(outside, selectors.EVENT_WRITE, self)  # writable once connected

    def other(self, sock: socket.socket) -> socket.socket:
        return self.outside if sock is self.inside else self.inside

    def ready(self, sock: socket.socket, events: int) -> None:
        try:
            if not self.connected:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.done = True
                    return
                self.connected = True
                self.selector.register(self.inside, selectors.EVENT_READ, self)
            if events & selectors.EVENT_WRITE and self.pending[sock]:
                sent = sock.send(self.pending[sock])
                del self.pending[sock][:sent]
            if events & selectors.EVENT_READ and len(self.pending[self.other(sock)]) < BUFFER:
                data = sock.recv(65536)
                if data:
                    self.pending[self.other(sock)] += data
                else:
                    self.eof[sock] = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.done = True
            return
        self._update()

    def _update(self) -> None:
        for sock in (self.inside, self.outside):
            other = self.other(sock)
            if self.eof[other] and not self.pending[sock]:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)  # the other side said all it had: so do we, once sent
            wanted = 0
            if not self.eof[sock] and len(self.pending[other]) < BUFFER:
                wanted |= selectors.EVENT_READ
            if self.pending[sock]:
                wanted |= selectors.EVENT_WRITE
            registered = sock in self.selector.get_map()
            if wanted and registered:
                self.selector.modify(sock, wanted, self)
            elif wanted:
                self.selector.register(sock, wanted, self)
            elif registered:
                self.selector.unregister(sock)
        if all(self.eof.values()) and not any(self.pending.values()):
            self.done = True

    def close(self) -> None:
        for sock in (self.inside, self.outside):
            if sock in self.selector.get_map():
                self.selector.unregister(sock)
            _close(sock)


def _close(s) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
