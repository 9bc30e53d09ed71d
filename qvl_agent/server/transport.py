"""Slow, broken and oversized clients: timeouts on the request head and body, and one uvicorn config.

uvicorn closes idle keep-alive connections, but a client that trickles its request head one byte at a
time keeps re-arming nothing and holds its socket forever. `HeadTimeoutProtocol` gives every request
head `head_timeout_s` from the moment the connection opens (or the previous response ended); the body
then has `body_timeout_s` in all (`read_body`, 408). A client that goes away mid-body is one log line.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from fastapi import Request
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from qvl_agent.server.protocol import ApiError

log = logging.getLogger("qvl_agent.server")
HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 5


class ClientGone(Exception):
    """The client disconnected; nobody is left to answer."""


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._cycle_before_head:  # a new request's head was read in full
            self._cancel_head_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._cycle_before_head = self.cycle
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

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


def uvicorn_config(app, head_timeout_s: float = HEAD_TIMEOUT_S, **kw) -> uvicorn.Config:
    """How `serve` (and the tests' live server) run the app under uvicorn."""
    protocol = type("HeadTimeout", (HeadTimeoutProtocol,), {"head_timeout_s": head_timeout_s})
    return uvicorn.Config(
        app, http=protocol, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_S, **kw
    )


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
