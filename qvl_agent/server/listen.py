"""Listening sockets for the HTTP servers (`serve`, `mcp --http`): bound before a model loads, so a busy
port or a wrong address fails in a second rather than after the load; and the descriptors they may use
(the soft RLIMIT_NOFILE raised to the hard one, connections capped below it)."""

from __future__ import annotations

import socket

from qvl_agent.errors import UsageError

DEFAULT_MAX_CONNECTIONS = 1000  # `serve --max-connections`
# asyncio accepts up to ACCEPT_BURST connections per loop turn, and a connection is counted (and an evicted
# one's descriptor closed) a turn or two later, so the cap keeps three bursts of descriptors free, plus 64
# for the process itself (the engine, logs, the threadpool).
ACCEPT_BURST = 32
RESERVED_FDS = 3 * ACCEPT_BURST + 64


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


def raise_fd_limit() -> int | None:
    """Raise the soft descriptor limit to the hard one (Linux defaults to 1,024 soft); the soft limit now in
    force, or None where there is none to read (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # some systems cap it lower than the hard limit says
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(wanted: int, fd_limit: int | None) -> int:
    """The connections a server may hold open: `wanted`, but always an eighth of the descriptors (and at
    least RESERVED_FDS) below the limit, so accept() never fails for want of one (which asyncio logs with
    a traceback on every try)."""
    if fd_limit is None:
        return wanted
    return max(8, min(wanted, fd_limit - max(RESERVED_FDS, fd_limit // 8)))
