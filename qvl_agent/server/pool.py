"""Reuse for stateless clients: a bounded pool of recent sessions keyed by what they have seen.

An OpenAI client sends the whole conversation with every request. The engine's sessions keep their KV
cache (and the engine its vision features), so when a request's history — everything before its last
user message — is exactly the conversation a pooled session already holds, that session answers it and
only the new tokens are prefilled. Matching is by content, not by ids: the fingerprint covers the system
text, every user text, every image's content hash and every assistant reply.

A session is taken out of the pool while it generates, so two requests can never share one; when its
turn ends cleanly it goes back under the fingerprint of its new, longer conversation. The pool is only
touched from the server's single generation thread, but it locks anyway so metrics can read it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from qvl_agent.engine.base import Engine, Session
from qvl_agent.image import Screenshot


def fingerprint(
    system: str | None,
    turns: Iterable[tuple[str, Sequence[Screenshot], str]],
    scope: str = "",
    tools: list | None = None,
    text_first: bool = False,
) -> str:
    """A hash of a conversation's content: (user text, images, reply) per turn, plus the system text, the
    tools the template shows and the order of text and images, in its cache scope (a user and a cache salt:
    other scopes never match it)."""
    h = hashlib.blake2b(digest_size=20)
    order = ["text first"] if text_first else []
    h.update(json.dumps(["system", system, scope, tools or None, *order], sort_keys=True).encode())
    for text, images, reply in turns:
        h.update(json.dumps([text, [im.content_hash for im in images], reply], ensure_ascii=False).encode())
    return h.hexdigest()


def session_fingerprint(session: Session, scope: str = "") -> str:
    turns = ((t.text, t.images, t.reply) for t in session.turns)
    return fingerprint(session.system, turns, scope, session.tools, session.text_first)


class SessionPool:
    """Up to `capacity` idle sessions, least recently used evicted (and closed) first."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._idle: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)

    def checkout(
        self,
        engine: Engine,
        system: str | None,
        history: Sequence[tuple[str, Sequence[Screenshot], str]],
        scope: str = "",
        tools: list | None = None,
        text_first: bool = False,
    ) -> tuple[Session, bool]:
        """A session that holds exactly `history` (with `tools` shown) in `scope`, in that order of text and
        images: a pooled one (reused=True) or a new one fed the history with `add_turn` (reused=False). The
        caller owns it until `checkin` or `close`."""
        key = fingerprint(system, history, scope, tools, text_first)
        with self._lock:
            session = self._idle.pop(key, None)
        if session is not None:
            return session, True
        session = engine.open_session(system=system, tools=tools)
        session.text_first = text_first
        for text, images, reply in history:
            session.add_turn(text, images, reply)
        return session, False

    def checkin(self, session: Session, scope: str = "") -> None:
        """Put a session whose last turn ended cleanly back, under its new conversation's fingerprint."""
        key = session_fingerprint(session, scope)
        evicted: list[Session] = []
        with self._lock:
            old = self._idle.pop(key, None)
            if old is not None:
                evicted.append(old)
            self._idle[key] = session
            while len(self._idle) > self.capacity:
                evicted.append(self._idle.popitem(last=False)[1])
        for s in evicted:
            s.close()

    def close(self) -> None:
        with self._lock:
            sessions = list(self._idle.values())
            self._idle.clear()
        for s in sessions:
            s.close()
