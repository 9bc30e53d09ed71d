"""A scripted engine: returns recorded model replies in order, for tests and demos.

`replay:FILE` names a JSON array of strings, each one reply exactly as Qwen3-VL would write it. Replies
are consumed in order across all sessions. Every request is recorded in `engine.requests`, so a test can
check what the model was shown (for instance the parse error fed back after a broken reply).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from qvl_agent.engine.base import Engine, GenerationOptions, Request, Session, TurnStats
from qvl_agent.errors import EngineError, GenerationCancelled, ReplayExhaustedError
from qvl_agent.image import Screenshot


def _pieces(text: str) -> list[str]:
    """Split a reply the way a tokenizer streams it: words with their leading whitespace."""
    return re.findall(r"\s*\S+|\s+", text) or [""]


class ReplayEngine(Engine):
    def __init__(self, replies: Sequence[str], name: str = "replay", delay_s: float = 0.0):
        self.replies = list(replies)
        self.name = name
        self.delay_s = delay_s  # per piece, to make streaming visible in demos
        self.position = 0
        self.requests: list[Request] = []

    @classmethod
    def from_file(cls, path: str | Path, delay_s: float = 0.0) -> ReplayEngine:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EngineError(f"No such replay file: {p}.") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EngineError(f"The replay file {p} is not valid JSON ({exc}).") from None
        if not isinstance(data, list) or not all(isinstance(r, str) for r in data):
            raise EngineError(f"The replay file {p} must hold a JSON array of strings (one reply each).")
        return cls(data, name=f"replay:{p}", delay_s=delay_s)

    def open_session(self, images=(), system=None, tools=None) -> ReplaySession:
        return ReplaySession(self, images, system, tools)

    def next_reply(self) -> str:
        if self.position >= len(self.replies):
            raise ReplayExhaustedError(
                f"The replay engine {self.name} has no more recorded replies (all {len(self.replies)} were used)."
            )
        reply = self.replies[self.position]
        self.position += 1
        return reply


class ReplaySession(Session):
    def __init__(self, engine: ReplayEngine, images, system, tools):
        super().__init__(images, system, tools)
        self.engine = engine

    def _generate(self, text: str, images: tuple[Screenshot, ...], options: GenerationOptions) -> Iterator[str]:
        start = time.perf_counter()
        self.engine.requests.append(
            Request(
                self.id,
                self.system,
                text,
                [im.content_hash for im in images],
                tools=self.tools,
                history=[(t.text, t.reply) for t in self.turns],
                image_sizes=[im.size for im in images],
                text_first=self.text_first,
            )
        )
        reply = self.engine.next_reply()
        pieces = _pieces(reply)
        for piece in pieces:
            if self.cancelled:
                raise GenerationCancelled("The answer was stopped.")
            if self.engine.delay_s:
                time.sleep(self.engine.delay_s)
            yield piece
        end = time.perf_counter()
        # No model ran: no first-token time or decode rate to report (on a busy machine the time this took
        # would read as one), only how many pieces the reply had and how long it took in all.
        self.last_stats = TurnStats(
            vision="none" if not images else "miss",
            ttft_ms=0.0,
            decode_tokens=len(pieces),
            decode_tokens_per_s=0.0,
            total_ms=(end - start) * 1000,
        )
