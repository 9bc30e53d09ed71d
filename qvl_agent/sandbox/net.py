"""The sandbox's network: the host side of its relays (see `bubblewrap.py`, **Network**).

`inside_addresses(targets)` says where each origin's relay listens inside the sandbox and writes the
sandbox's /etc/hosts; `Forwarder` is the one way out for one origin: a unix socket bound into the sandbox
whose every connection is relayed to that origin's address, resolved once before the run, and nowhere
else.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from pathlib import Path

from qvl_agent.errors import SandboxUnavailable
from qvl_agent.sandbox.init_in_sandbox import pipe as _pipe  # the same byte relay runs on both sides

MAX_CONNECTIONS = 64  # open connections through one forwarder at once


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
    """The sandbox's one way out: a unix socket whose every connection is relayed to the target's origin."""

    def __init__(self, path: Path, target) -> None:
        port = port_of(target)
        # Resolved once, now: the sandbox cannot steer a later lookup elsewhere. A name that does not resolve
        # leaves no address: the script's connections then fail, and its own error says so.
        try:
            found = socket.getaddrinfo(target.hostname, port, type=socket.SOCK_STREAM)
        except OSError:
            found = []
        self.addresses = [info[4][:2] for info in found]
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(MAX_CONNECTIONS)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.stopped = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="qvl-sandbox-forwarder", daemon=True).start()

    def stop(self) -> None:
        self.stopped = True
        self.listener.close()
        with self.lock:
            for s in self.open:
                _close(s)

    def _accept(self) -> None:
        while not self.stopped:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                inside.close()
                continue
            threading.Thread(target=self._relay, args=(inside,), daemon=True).start()

    def _relay(self, inside: socket.socket) -> None:
        outside = None
        try:
            for address in self.addresses:
                try:
                    outside = socket.create_connection(address, timeout=10)
                    outside.settimeout(None)
                    break
                except OSError:
                    continue
            if outside is None:
                return
            with self.lock:
                if self.stopped:
                    return
                self.open.update((inside, outside))
            back = threading.Thread(target=_pipe, args=(outside, inside), daemon=True)
            back.start()
            _pipe(inside, outside)
            back.join()
        finally:
            for s in (inside, outside):
                if s is not None:
                    _close(s)
                    with self.lock:
                        self.open.discard(s)
            self.slots.release()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
