"""Listening sockets for the HTTP servers (`serve`, `mcp --http`): bound before a model loads, so a busy
port or a wrong address fails in a second rather than after the load."""

from __future__ import annotations

import socket

from qvl_agent.errors import UsageError


def bind(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a busy port fails in a second rather than after the load."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be from 0 to 65535, not {port}.")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise UsageError(f"Cannot listen on {host!r}: no such address.") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UsageError(f"Cannot listen on {host}:{port} ({exc.strerror}); is another server using it?") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def browser_host(host: str) -> str:
    """The host part of an address a browser on this machine can open (a wildcard bind -> 127.0.0.1)."""
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
