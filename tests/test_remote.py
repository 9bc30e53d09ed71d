"""RemoteEngine against our own server running on 127.0.0.1 (echo and replay engines behind it):
streaming, images as PNG data URLs, follow-ups that reuse the server's session, and one clear
sentence for every way a server can fail."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from qvl_agent.config import DEFAULT_MODEL, Settings
from qvl_agent.engine import open_engine
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.remote import RemoteEngine
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.errors import GenerationCancelled, RemoteEngineError
from qvl_agent.image import Screenshot
from qvl_agent.server.app import create_app
from tests.support.live_server import EchoEngine, LiveServer

TOKEN = "remote-test-token"


def screenshot(color=(10, 200, 30, 0), size=(40, 30)) -> Screenshot:
    w, h = size
    return Screenshot(bytes(color) * (w * h), w, h, "BGRA")


def serve(engine, model="served-model", **kw):
    return LiveServer(create_app(engine, Settings(model=model), token=TOKEN, **kw))


def test_ask_and_a_follow_up_that_reuses_the_servers_session():
    backend = EchoEngine()
    with serve(backend) as url, RemoteEngine(url, api_key=TOKEN, model="served-model") as engine:
        session = engine.open_session([screenshot()], system="Be brief.")
        pieces = list(session.ask("what is on screen"))
        assert len(pieces) > 1  # it streamed
        reply = "".join(pieces)
        assert reply.startswith("echo:what is on screen|images:") and "turns:0" in reply
        assert reply.split("|images:")[1].split("|")[0] != ""  # the screenshot reached the server
        first = session.last_stats
        assert first.vision == "miss" and first.decode_tokens == len(pieces) and first.ttft_ms > 0

        follow = session.complete("and the title?")
        assert follow.startswith("echo:and the title?|images:|turns:1")
        stats = session.last_stats
        assert stats.vision == "hit"  # the server continued the session that holds the screenshot
        assert stats.cached_tokens > 0 and stats.prefill_tokens < stats.prompt_tokens
        assert len(backend.sessions) == 1
        assert backend.sessions[0].system == "Be brief."


def test_sampling_options_reach_the_server_and_only_when_set():
    backend = EchoEngine()
    with serve(backend) as url, RemoteEngine(url, api_key=TOKEN, model="served-model") as engine:
        session = engine.open_session()
        tuned = GenerationOptions(max_new_tokens=5, temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5)
        session.complete("sample this", options=tuned)
        got = backend.options[-1]
        assert (got.temperature, got.top_p, got.top_k, got.presence_penalty) == (0.7, 0.8, 20, 1.5)
        assert got.max_new_tokens == 5
        plain = session.request("x", (), GenerationOptions())
        assert "extra_body" not in plain  # servers that know no top_k are not sent one
        assert session.request("x", (), tuned)["extra_body"] == {"top_k": 20, "presence_penalty": 1.5}


def test_open_engine_spec_and_default_model_resolution():
    with serve(EchoEngine(), model="/models/tiny-qwen") as url:
        settings = Settings(engine=f"openai:{url}/v1/", api_key=TOKEN)
        engine = open_engine(settings)
        assert isinstance(engine, RemoteEngine) and engine.base_url == f"{url}/v1"
        # Left on the default model id, the client uses the one model this server has.
        assert engine.requested_model == DEFAULT_MODEL and engine.model == "/models/tiny-qwen"
        assert engine.open_session().complete("hi").startswith("echo:hi")
        engine.close()

        named = RemoteEngine(url, api_key=TOKEN, model="other-model")
        with pytest.raises(RemoteEngineError, match="does not serve 'other-model'.*'/models/tiny-qwen'"):
            named.open_session().complete("hi")


def test_connection_refused_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    engine = RemoteEngine(f"http://127.0.0.1:{port}", model="m")
    with pytest.raises(RemoteEngineError, match=r"Cannot connect .*connection refused.*is it running\?"):
        engine.open_session().complete("hi")


def test_wrong_key_and_bad_url():
    with serve(EchoEngine()) as url:
        with pytest.raises(RemoteEngineError, match="refused the API key \\(401"):
            RemoteEngine(url, api_key="wrong", model="served-model").open_session().complete("hi")
    with pytest.raises(RemoteEngineError, match="needs an http:// or https:// URL"):
        RemoteEngine("localhost:8000")


def test_server_errors_carry_the_servers_message():
    with serve(ReplayEngine([])) as url:
        engine = RemoteEngine(url, api_key=TOKEN, model="served-model")
        with pytest.raises(RemoteEngineError, match="answered 500: The replay engine .* no more recorded"):
            engine.open_session().complete("hi")
        big = Screenshot(bytes(4) * (600 * 400), 600, 400, "BGRA")
    with serve(EchoEngine(), max_image_pixels=100_000) as url:
        engine = RemoteEngine(url, api_key=TOKEN, model="served-model")
        with pytest.raises(RemoteEngineError, match="answered 413: .*over this server's limit"):
            engine.open_session([big]).complete("hi")


def test_a_silent_server_times_out():
    with serve(EchoEngine(delay_s=2.0)) as url:
        engine = RemoteEngine(url, api_key=TOKEN, model="served-model", timeout_s=0.5)
        with pytest.raises(RemoteEngineError, match="did not answer within 0.5 s"):
            engine.open_session().complete("one two three")


def test_cancel_stops_the_remote_generation():
    backend = EchoEngine(delay_s=0.1)
    with serve(backend) as url:
        engine = RemoteEngine(url, api_key=TOKEN, model="served-model")
        session = engine.open_session()
        words = " ".join(f"w{i}" for i in range(200))
        stream = session.ask(words, options=GenerationOptions(max_new_tokens=500))
        assert next(stream)
        threading.Timer(0.3, session.cancel).start()
        with pytest.raises(GenerationCancelled):
            for _ in stream:
                pass
        deadline = time.monotonic() + 10
        while not backend.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backend.cancelled == [words]  # the server stopped generating too


def test_decode_speed_is_the_servers_figure_not_a_burst_of_chunks():
    import dataclasses

    from tests.support.live_server import EchoSession

    class Measured(EchoSession):
        def _generate(self, text, images, options):
            yield from super()._generate(text, images, options)
            self.last_stats = dataclasses.replace(self.last_stats, decode_tokens_per_s=431.0)

    class MeasuringEcho(EchoEngine):
        def open_session(self, images=(), system=None, tools=None):
            session = Measured(self, images, system, tools)
            self.sessions.append(session)
            return session

    with serve(MeasuringEcho()) as url, RemoteEngine(url, api_key=TOKEN, model="served-model") as engine:
        session = engine.open_session()
        session.complete("how fast is this reply decoded")
        assert session.last_stats.decode_tokens == 6
        assert session.last_stats.decode_tokens_per_s == 431.0  # what the server measured while decoding

    # A server without our stats: estimated from the first to the last chunk, never from a burst.
    from qvl_agent.engine.remote import _decode_rate

    assert _decode_rate(90, first=10.0, last=10.0001, qvl={}) == 0.0  # 90 tokens in 0.1 ms: a burst
    assert _decode_rate(11, first=10.0, last=10.5, qvl={}) == 20.0
    assert _decode_rate(1, first=10.0, last=10.0, qvl={}) == 0.0
