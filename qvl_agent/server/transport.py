"""Slow, broken and oversized clients: timeouts on the request head and body, a cap on connections, logs
that cannot flood, and one uvicorn config.

uvicorn closes idle keep-alive connections, but a client that trickles its request head one byte at a
time keeps re-arming nothing and holds its socket forever. `HeadTimeoutProtocol` gives every request
head `head_timeout_s` from the moment the connection opens (or the previous response ended); the body
then has `body_timeout_s` in all (`read_body`, 408). A client that goes away mid-body is one log line.

Connections are capped below the descriptor limit (`ConnectionLimit`): ~1,100 half-open request heads
under a 1,024-descriptor limit once made every accept() fail, starved `/health` until the head timeouts
fired, and wrote 59 MB of tracebacks in 25 s. At the cap, a new connection closes the oldest one that is
still waiting for its request head (half-open, or idle between keep-alive requests), so a client that
sends its request at once is served whoever holds the rest; when every connection is busy with a
request, the new one is closed instead. Log records are rate-limited (`RateLimit`): a few per minute for
each message, then one line saying how many were left out.
"""

from __future__ import annotations

import asyncio
import logging
import time

import uvicorn
from fastapi import Request
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from qvl_agent.server.listen import ACCEPT_BURST, DEFAULT_MAX_CONNECTIONS
from qvl_agent.server.protocol import ApiError

log = logging.getLogger("qvl_agent.server")
HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 5


class ClientGone(Exception):
    """The client disconnected; nobody is left to answer."""


class ConnectionLimit:
    """The server's open connections, and which of them wait for a request head (oldest first)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.open: set[HeadTimeoutProtocol] = set()
        self.waiting: dict[HeadTimeoutProtocol, None] = {}  # insertion order: the oldest first
        self.shed = 0  # connections closed to stay within the cap

    def admit(self, conn: HeadTimeoutProtocol) -> bool:
        """Count a new connection; at the cap, close the oldest one waiting for its head to make room, or
        return False (the caller closes the new one) when all are busy with requests."""
        if len(self.open) >= self.cap:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self.shed += 1
                log.warning("refused a connection from %s: %d connections are all busy", _peer(conn), self.cap)
                return False
            self.shed += 1
            log.warning(
                "%d connections open (the cap): closed the oldest one waiting for a request, from %s",
                self.cap,
                _peer(victim),
            )
            victim.drop()
        self.open.add(conn)
        return True

    def forget(self, conn: HeadTimeoutProtocol) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head, within a `ConnectionLimit`."""

    head_timeout_s = HEAD_TIMEOUT_S
    limit: ConnectionLimit | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self.limit is not None and not self.limit.admit(self):
            transport.abort()  # no response: writing one could itself wait on a client that reads nothing
            return
        self._arm_head_timer()

    def drop(self) -> None:
        """Close this connection now (it was waiting for a request head)."""
        self._cancel_head_timer()
        if self.limit is not None:
            self.limit.forget(self)
        if not self.transport.is_closing():
            self.transport.abort()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._cycle_before_head:  # a new request's head was read in full
            self._cancel_head_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        if self.limit is not None:
            self.limit.forget(self)
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._cycle_before_head = self.cycle
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)
        if self.limit is not None:
            self.limit.waiting[self] = None  # the newest waiting connection: evicted last

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None
        if self.limit is not None:
            self.limit.waiting.pop(self, None)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.warning(
                "closed a connection from %s: no complete request within %g s", _peer(self), self.head_timeout_s
            )
            self.transport.close()


def _peer(protocol: H11Protocol) -> str:
    client = protocol.client
    return f"{client[0]}:{client[1]}" if client else "a client"


def uvicorn_config(
    app, head_timeout_s: float = HEAD_TIMEOUT_S, max_connections: int = DEFAULT_MAX_CONNECTIONS, **kw
) -> uvicorn.Config:
    """How `serve` (and the tests' live server) run the app under uvicorn: at most `max_connections` open
    at once (the caller keeps it below the descriptor limit: `listen.connection_cap`)."""
    limit = ConnectionLimit(max_connections)
    protocol = type("HeadTimeout", (HeadTimeoutProtocol,), {"head_timeout_s": head_timeout_s, "limit": limit})
    rate_limit_logs()
    return uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=ACCEPT_BURST,  # also how many asyncio accepts in one go (uvicorn's default: 2,048)
        **kw,
    )


class RateLimit(logging.Filter):
    """At most `burst` records of each message per `period_s` seconds; the first record of the next period
    says how many were left out. A flood of one error (an accept() that fails, a client that breaks the
    protocol) then costs a few lines a minute, not megabytes."""

    def __init__(self, burst: int = 5, period_s: float = 60.0, clock=time.monotonic):
        super().__init__()
        self.burst, self.period_s, self.clock = burst, period_s, clock
        self._seen: dict[tuple[str, str], list] = {}  # (logger, message template) -> [period start, count, left out]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = self.clock()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.period_s:
            left_out = seen[2] if seen else 0
            if len(self._seen) > 1_000:  # messages are templates: this only bounds a pathological logger
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if left_out:
                record.msg = f"{record.msg} ({left_out} more like this in the last {self.period_s:g} s left out)"
            return True
        seen[1] += 1
        if seen[1] <= self.burst:
            return True
        seen[2] += 1
        return False


RATE_LIMITED_LOGGERS = ("asyncio", "uvicorn.error", "qvl_agent.server")


def rate_limit_logs() -> None:
    """Put one `RateLimit` on the loggers a connection flood writes to (once per process)."""
    for name in RATE_LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimit) for f in logger.filters):
            logger.addFilter(RateLimit())


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body: 413 as soon as it is known to exceed `limit` bytes, 408 when it takes longer than
    `timeout_s`, `ClientGone` (one log line) when the client disconnects before sending all of it."""
    too_big = ApiError(
        413, f"The request body is over this server's limit of {limit:,} bytes.", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
        ) from None
    except ClientDisconnect:
        client = request.client
        who = f"{client.host}:{client.port}" if client else "a client"
        log.warning("%s disconnected before sending the whole request body (%d bytes read)", who, size)
        raise ClientGone() from None
    return b"".join(chunks)
