"""A streamed reply streams: its text reaches the client while the engine is still generating, on the
single-stream path (`--max-batch 1`) and on the batched one, with a model whose vocabulary is as wide as
the real 2B's (151,936 ids) over the tiny tokenizer, as the serving benchmark's random model has.

No clock decides: the engine is held at a stream's HOLD-th token until a client has seen that stream's
first text. A server (or a model) whose first text comes only with the whole reply never lets the engine
past that point, and the test says so instead of passing."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading

import httpx
import pytest
from PIL import Image

from qvl_agent.config import Settings
from qvl_agent.devtools.tiny_model import save_random_model
from qvl_agent.engine import decode
from qvl_agent.server.worker import _PieceTokenizer

pytestmark = pytest.mark.slow
TOKEN = "tiny-test-token-0123"
MAX_TOKENS = 48
HOLD = 6  # the engine waits at each stream's 6th token until its client has seen text
WAIT_S = 30  # only a guard against a hang: an engine still held after this fails the test


class ArrivalGate:
    """Counts the tokens the engine turns into text, per stream and in all, and holds a stream at its
    HOLD-th token until as many clients have seen their first text as streams have reached HOLD."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.generated = 0  # tokens the engine produced, all streams
        self.held = 0  # streams that reached HOLD
        self.seen = 0  # clients that saw their first text
        self.stuck = 0  # streams released by the guard, not by a client seeing text
        self.at_first_text: list[int] = []  # `generated` when each client saw its first text

    def token(self, stream_tokens: int) -> None:
        with self.cond:
            self.generated += 1
            if stream_tokens == HOLD:
                self.held += 1
                if not self.cond.wait_for(lambda: self.seen >= self.held, timeout=WAIT_S):
                    self.stuck += 1

    def first_text(self) -> None:
        with self.cond:
            self.seen += 1
            self.at_first_text.append(self.generated)
            self.cond.notify_all()


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    return save_random_model(tmp_path_factory.mktemp("tiny-wide"), "tiny", vocab_size=151_936)


@pytest.fixture
def gate(monkeypatch) -> ArrivalGate:
    gate = ArrivalGate()
    push = decode.TextStream.push

    def counted_push(self, token_id: int) -> str:
        if not isinstance(self.tokenizer, _PieceTokenizer):  # the engine's own stream, not the server's
            self.counted = getattr(self, "counted", 0) + 1
            gate.token(self.counted)
        return push(self, token_id)

    monkeypatch.setattr(decode.TextStream, "push", counted_push)
    return gate


def _png_url(n: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (80, 56), (n * 60 % 256, 90, 200)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _body(n: int) -> dict:
    content = [{"type": "image_url", "image_url": {"url": _png_url(n)}}, {"type": "text", "text": f"client {n}?"}]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "min_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _stream(http: httpx.AsyncClient, url: str, body: dict, gate: ArrivalGate) -> dict:
    """One streamed request: its text chunks in order, its usage and the server's stats."""
    pieces, usage, stats = [], {}, {}
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            stats = chunk.get("qvl") or stats
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    if not pieces:
                        gate.first_text()
                    pieces.append(choice["delta"]["content"])
    return {"pieces": pieces, "usage": usage, "stats": stats}


def _serve_and_stream(model_dir, max_batch: int, clients: int, gate: ArrivalGate) -> list[dict]:
    from qvl_agent.engine import open_engine
    from qvl_agent.server.app import create_app
    from tests.support.live_server import LiveServer

    settings = Settings(model=str(model_dir), device="cpu", max_batch=max_batch)
    engine = open_engine(settings)
    try:
        with LiveServer(create_app(engine, settings, token=TOKEN)) as url:

            async def all_at_once():
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with httpx.AsyncClient(timeout=300, headers=headers) as http:
                    return await asyncio.gather(*(_stream(http, url, _body(n), gate) for n in range(clients)))

            return asyncio.run(all_at_once())
    finally:
        engine.close()


@pytest.mark.parametrize("max_batch,clients", [(1, 1), (4, 3)], ids=["single-stream", "batched"])
def test_text_reaches_the_client_while_the_engine_still_generates(wide_model_dir, gate, max_batch, clients):
    replies = _serve_and_stream(wide_model_dir, max_batch, clients, gate)
    assert gate.stuck == 0, "the engine was held at a stream's 6th token and no client ever saw its text"
    assert len(gate.at_first_text) == clients, "a reply came without any text"
    for reply in replies:
        assert reply["usage"]["completion_tokens"] == MAX_TOKENS
        assert len(reply["pieces"]) > 1, "the whole reply came in one chunk"
    # The first text reached its client while the engine had produced at most HOLD tokens of each stream.
    assert min(gate.at_first_text) <= clients * HOLD < gate.generated
    if max_batch > 1:
        assert max(r["stats"]["decode_batch_max"] for r in replies) >= 2, "no two streams decoded together"
