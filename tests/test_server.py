"""The HTTP API over a real uvicorn server on 127.0.0.1, with the echo and replay engines: protocol,
reuse by content, every bad request answered properly while the server stays healthy, 429 under load,
cancellation on disconnect, timeouts, and 32 concurrent clients each getting their own replies."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time

import httpx
import pytest
from PIL import Image

from qvl_agent.config import Settings
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.server.app import create_app
from tests.support.live_server import EchoEngine, LiveServer

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SETTINGS = Settings(model="qvl-test-model")


def png_url(width=64, height=48, color=(200, 30, 30), fmt="PNG", mime="image/png") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format=fmt)
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def user(text, *images):
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}] if images else text}


def serve(engine, **kw):
    return LiveServer(create_app(engine, SETTINGS, token=TOKEN, **kw))


def post(url, body, headers=AUTH, timeout=30.0):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return httpx.post(url + "/v1/chat/completions", content=data, headers=headers, timeout=timeout)


def assert_healthy(url):
    assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
    ok = post(url, {"model": "qvl-test-model", "messages": [user("still there?")]})
    assert ok.status_code == 200, ok.text
    assert "still there?" in ok.json()["choices"][0]["message"]["content"]


def test_models_health_and_a_plain_answer():
    with serve(ReplayEngine(["The screen shows a login form."])) as url:
        assert httpx.get(url + "/health").json()["status"] == "ok"
        models = httpx.get(url + "/v1/models", headers=AUTH).json()
        assert [m["id"] for m in models["data"]] == ["qvl-test-model"]
        reply = post(url, {"model": "qvl-test-model", "messages": [user("What is this?", png_url())]})
        assert reply.status_code == 200
        body = reply.json()
        assert body["choices"][0]["message"]["content"] == "The screen shows a login form."
        assert body["choices"][0]["finish_reason"] == "stop"
        assert reply.headers["x-qvl-vision"] == "miss"


def test_streaming_sends_pieces_then_stats_usage_and_done():
    with serve(ReplayEngine(["One two three four."])) as url:
        body = {"messages": [user("count")], "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=AUTH) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "One two three four."
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_follow_up_from_a_stateless_client_continues_the_pooled_session():
    engine = EchoEngine()
    with serve(engine) as url:
        shot = png_url()
        first = post(url, {"messages": [user("what is red?", shot)]})
        reply = first.json()["choices"][0]["message"]["content"]
        assert first.headers["x-qvl-session-reused"] == "false"
        history = [user("what is red?", shot), {"role": "assistant", "content": reply}]
        follow = post(url, {"messages": [*history, user("and then?")]})
        assert follow.headers["x-qvl-session-reused"] == "true"
        assert follow.headers["x-qvl-vision"] == "hit"  # the screenshot's features live in the reused KV
        usage = follow.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        assert (
            int(follow.headers["x-qvl-prefill-tokens"])
            == usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
        )
        assert len(engine.sessions) == 1  # no session was rebuilt
        # An edited history (another reply) does not match: a fresh session is fed the history instead.
        edited = [history[0], {"role": "assistant", "content": "something else"}, user("and then?")]
        other = post(url, {"messages": edited})
        assert other.headers["x-qvl-session-reused"] == "false"
        assert other.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert "turns:1" in other.json()["choices"][0]["message"]["content"]  # the history reached it
        assert len(engine.sessions) == 2


def test_the_served_id_and_the_hugging_face_name_both_name_the_model():
    with serve(EchoEngine()) as url:
        for name in ("qvl-test-model", "Qwen/Qwen3-VL-2B-Instruct", ""):
            r = post(url, {"model": name, "messages": [user("which model")]})
            assert r.status_code == 200 and r.json()["model"] == "qvl-test-model"
        other = post(url, {"model": "Qwen/Qwen3-VL-8B-Instruct", "messages": [user("x")]})
        assert other.status_code == 404 and "'qvl-test-model'" in other.json()["error"]["message"]


def test_stop_strings_cut_the_reply():
    with serve(EchoEngine()) as url:
        r = post(url, {"messages": [user("alpha beta gamma")], "stop": ["gamma"]})
        assert r.json()["choices"][0]["message"]["content"] == "echo:alpha beta "


def test_token_is_required_and_compared():
    with serve(EchoEngine()) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = post(url, {"messages": [user("hi")]}, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/").status_code == 401
        assert httpx.get(url + "/?token=nope").status_code == 401
        assert httpx.get(url + f"/?token={TOKEN}").status_code == 200
        assert_healthy(url)


BAD_REQUESTS = [
    ("malformed JSON", b'{"messages": [', 400, "invalid_json"),
    ("bad base64", {"messages": [user("x", "data:image/png;base64,@@not base64@@")]}, 400, "invalid_base64"),
    (
        "not an image",
        {"messages": [user("x", "data:image/png;base64," + base64.b64encode(b"hello").decode())]},
        400,
        "invalid_image",
    ),
    ("GIF", {"messages": [user("x", png_url(fmt="GIF", mime="image/gif"))]}, 400, "invalid_image_format"),
    ("over the pixel limit", {"messages": [user("x", png_url(400, 300))]}, 413, "image_too_large"),
    ("unknown model", {"model": "gpt-9", "messages": [user("x")]}, 404, "model_not_found"),
    (
        "remote image URL",
        {"messages": [user("x", "https://example.com/a.png")]},
        400,
        "image_url_not_allowed",
    ),
    ("no user message last", {"messages": [user("x"), {"role": "assistant", "content": "y"}]}, 400, None),
    ("bad temperature", {"messages": [user("x")], "temperature": "hot"}, 400, None),
    ("empty content list", {"messages": [{"role": "user", "content": []}]}, 400, None),
    (
        "only blank text",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "  "}]}]},
        400,
        None,
    ),
]


@pytest.mark.parametrize("name,body,status,code", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_openai_errors_and_the_server_stays_healthy(name, body, status, code):
    with serve(EchoEngine(), max_image_pixels=100_000) as url:
        r = post(url, body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"].endswith(".") and "Traceback" not in error["message"]
        if code:
            assert error["code"] == code
        assert_healthy(url)


def test_body_over_the_limit_is_413():
    with serve(EchoEngine(), max_body_bytes=10_000) as url:
        r = post(url, {"messages": [user("x" * 20_000)]})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert_healthy(url)


def test_too_many_at_once_get_429_with_retry_after():
    engine = EchoEngine()
    engine.gate = threading.Event()  # held busy until the burst's overflow has been answered
    with serve(engine, max_queue=2) as url:

        async def burst():
            async with httpx.AsyncClient(timeout=60, headers=AUTH) as client:
                body = {"messages": [user("a slow question with many words in it")]}
                chat = url + "/v1/chat/completions"
                pending = {asyncio.ensure_future(client.post(chat, json=body)) for _ in range(10)}
                tasks = set(pending)
                answered = 0
                while answered < 7 and pending:  # one running and two waiting: the other seven are refused
                    done, pending = await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    if not done:
                        break
                    answered += len(done)
                engine.gate.set()
                return [await t for t in tasks]

        replies = asyncio.run(burst())
        codes = sorted(r.status_code for r in replies)
        assert 200 in codes and 429 in codes and set(codes) == {200, 429}
        for r in replies:
            if r.status_code == 429:
                assert int(r.headers["Retry-After"]) >= 1
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert engine.max_active == 1
        assert_healthy(url)
        metrics = httpx.get(url + "/metrics", headers=AUTH).text
        assert 'qvl_requests_total{endpoint="/v1/chat/completions",status="429"}' in metrics


def test_a_client_that_disconnects_cancels_its_generation():
    engine = EchoEngine(delay_s=0.2)
    with serve(engine) as url:
        words = " ".join(f"w{i}" for i in range(100))
        body = {"messages": [user(words)], "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=AUTH) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if "content" in line)
        deadline = time.monotonic() + 10
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.cancelled == [words]
        engine.delay_s = 0
        assert_healthy(url)


def test_non_streaming_client_that_gives_up_cancels_too():
    engine = EchoEngine(delay_s=0.2)
    with serve(engine) as url:
        words = " ".join(f"w{i}" for i in range(100))
        with pytest.raises(httpx.ReadTimeout):
            post(url, {"messages": [user(words)]}, timeout=1.0)
        deadline = time.monotonic() + 10
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.cancelled == [words]


def test_request_timeout_answers_504_and_stops_the_generation():
    engine = EchoEngine(delay_s=0.2)
    with serve(engine, request_timeout_s=1.0) as url:
        words = " ".join(f"w{i}" for i in range(100))
        r = post(url, {"messages": [user(words)]})
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        deadline = time.monotonic() + 10
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.cancelled == [words]


def test_32_concurrent_clients_each_get_their_own_replies():
    engine = EchoEngine(delay_s=0.001)
    results: dict[str, list] = {}
    with serve(engine, max_queue=12) as url:

        async def client(n: int, http: httpx.AsyncClient):
            messages: list = []
            shot = png_url(32, 32, (n * 7 % 256, n, 255 - n))
            for k in range(4):
                text = f"client{n}-q{k}"
                messages.append(user(text, shot) if k == 0 else user(text))
                stream = k % 2 == 1
                body = {"messages": messages, "stream": stream}
                try:
                    r = await http.post(url + "/v1/chat/completions", json=body)
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    # HTTP/1.1's keep-alive race: the server closed an idle pooled connection (after
                    # transport.KEEP_ALIVE_S) just as this request went out on it. OpenAI's clients retry it.
                    r = await http.post(url + "/v1/chat/completions", json=body)
                if r.status_code == 429:
                    assert r.json()["error"]["code"] == "rate_limit_exceeded" and "Retry-After" in r.headers
                    results.setdefault(text, []).append("refused")
                    messages.pop()
                    continue
                assert r.status_code == 200, r.text
                if stream:
                    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
                    reply = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
                else:
                    reply = r.json()["choices"][0]["message"]["content"]
                results.setdefault(text, []).append(reply)
                messages.append({"role": "assistant", "content": reply})

        async def main():
            async with httpx.AsyncClient(timeout=120, headers=AUTH, limits=httpx.Limits(max_connections=64)) as http:
                await asyncio.gather(*(client(n, http) for n in range(32)))

        asyncio.run(main())
        assert_healthy(url)
    answered = {t: r[0] for t, r in results.items() if r[0] != "refused"}
    assert len(results) == 32 * 4 and len(answered) > 32
    for text, reply in answered.items():
        assert reply.startswith(f"echo:{text}|"), (text, reply)  # every reply belongs to its own request
    assert engine.max_active == 1


def test_shutdown_with_a_queue_does_not_hang():
    engine = EchoEngine(delay_s=0.05)
    server = serve(engine)
    with server as url:

        def ask():
            try:
                post(url, {"messages": [user("x y z")]})
            except httpx.HTTPError:
                pass  # the server went away mid-request: that is what this test does

        threads = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.1)
    assert not server.thread.is_alive()


def test_a_cache_salt_or_another_user_shares_no_session_with_a_conversation():
    """vLLM's cache_salt, and `serve --tokens-file`'s users: a client cannot confirm a guess of someone
    else's conversation from `x-qvl-session-reused` or `cached_tokens`."""
    ann, bob = "ann-token-0123456789", "bob-token-0123456789"
    with LiveServer(create_app(EchoEngine(), SETTINGS, users={"ann": ann, "bob": bob})) as url:
        as_ann, as_bob = ({"Authorization": f"Bearer {t}"} for t in (ann, bob))
        first = post(url, {"messages": [user("my plans", png_url())], "cache_salt": "s1"}, headers=as_ann)
        history = [
            user("my plans", png_url()),
            {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
        ]
        guess = {"messages": [*history, user("and?")]}
        for headers, salt in ((as_ann, "s2"), (as_bob, "s1"), (as_ann, None)):
            other = post(url, {**guess, **({"cache_salt": salt} if salt else {})}, headers=headers)
            assert other.status_code == 200, other.text
            assert other.headers["x-qvl-session-reused"] == "false", (headers, salt)
            assert other.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        same = post(url, {**guess, "cache_salt": "s1"}, headers=as_ann)
        assert same.headers["x-qvl-session-reused"] == "true"  # the same user and salt still reuse
        assert post(url, guess, headers=AUTH).status_code == 401  # a token of no user
        bad = post(url, {**guess, "cache_salt": ""}, headers=as_ann)
        assert bad.status_code == 400 and "cache_salt" in bad.text


def test_a_profile_that_puts_text_first_keeps_its_order_through_this_server():
    """A client asking MAI-UI's way (`--engine openai:URL --profile mai-ui`): the text, then the image."""
    from qvl_agent import profiles
    from qvl_agent.engine.remote import RemoteEngine
    from qvl_agent.grounding import locate, system_prompt, user_text
    from qvl_agent.image import Screenshot

    engine = ReplayEngine(['<answer>{"coordinate": [500,500]}</answer>', "A login form."])
    with serve(engine) as url:
        remote = RemoteEngine(url, api_key=TOKEN, model="qvl-test-model")
        remote.profile = profiles.get("mai-ui")
        point = locate(remote, Screenshot(b"\0\0\0" * (64 * 48), 64, 48, "RGB"), "the OK button")
        assert (point.x, point.y) == (32, 24)
        plain = post(url, {"model": "qvl-test-model", "messages": [user("What is this?", png_url())]})
        assert plain.status_code == 200
    first, second = engine.requests
    assert first.text_first and first.text == user_text("the OK button", profiles.get("mai-ui"))
    assert first.system == system_prompt(profiles.get("mai-ui"))
    assert not second.text_first  # the usual order stays the usual order
