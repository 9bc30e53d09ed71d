"""`qvl-agent serve` started as a user would, with the tiny random Qwen3-VL on CPU: the official
`openai` client (streaming and not, with an image), reuse for a stateless follow-up, the remote engine
end to end, and 32 concurrent clients whose replies each match a single-client reference."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import statistics
import time

import httpx
import openai
import pytest
from PIL import Image

from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.remote import RemoteEngine
from qvl_agent.image import Screenshot
from tests.support.live_server import start_serve, stop_serve

pytestmark = [pytest.mark.slow, pytest.mark.same_worker]  # one server for the module
TOKEN = "tiny-test-token-0123"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    config = tmp_path_factory.mktemp("serve-config")
    url, proc, _ = start_serve(
        "--model", str(tiny_model_dir), "--device", "cpu", "--max-queue", "40", config_dir=config, token=TOKEN
    )
    yield url
    assert stop_serve(proc) == 0


def png_url(color, size=(96, 64)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def question(text, color):
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": png_url(color)}},
            {"type": "text", "text": text},
        ],
    }


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-9])
def test_a_temperature_that_rounds_to_greedy_is_greedy_not_a_500(server, tiny_model_dir, temperature):
    client = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN)
    messages = [question("What is on this screen?", (20, 120, 200))]
    ask = functools.partial(client.chat.completions.create, model=str(tiny_model_dir), messages=messages, max_tokens=8)
    assert ask(temperature=temperature).choices[0].message.content == ask(temperature=0).choices[0].message.content


def test_openai_client_streaming_and_not_with_an_image(server, tiny_model_dir):
    client = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN)
    models = [m.id for m in client.models.list()]
    assert models == [str(tiny_model_dir)]
    messages = [question("What is on this screen?", (250, 120, 0))]
    reply = client.chat.completions.create(model=models[0], messages=messages, max_tokens=12, temperature=0)
    text = reply.choices[0].message.content
    finish = reply.choices[0].finish_reason
    assert reply.usage.completion_tokens >= 1
    assert finish == ("length" if reply.usage.completion_tokens == 12 else "stop")
    assert reply.usage.prompt_tokens > 0

    stream = client.chat.completions.create(
        model=models[0],
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text  # greedy: the same question gets the same answer either way
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong").models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=messages)


def test_stateless_follow_up_prefills_only_new_tokens(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN)
    history = [question("Describe the picture.", (10, 90, 200))]
    first = client.chat.completions.with_raw_response.create(model="", messages=history, max_tokens=10)
    assert first.headers["x-qvl-vision"] == "miss"
    history.append({"role": "assistant", "content": first.parse().choices[0].message.content})
    history.append({"role": "user", "content": "And the colour?"})

    reused = client.chat.completions.with_raw_response.create(model="", messages=history, max_tokens=10)
    # The same follow-up again finds no pooled session holding exactly this history (the first one moved
    # on to the longer conversation), so it is rebuilt from the text: the cost without reuse.
    rebuilt = client.chat.completions.with_raw_response.create(model="", messages=history, max_tokens=10)
    assert reused.headers["x-qvl-session-reused"] == "true" and reused.headers["x-qvl-vision"] == "hit"
    assert rebuilt.headers["x-qvl-session-reused"] == "false"
    assert rebuilt.headers["x-qvl-vision"] == "hit"  # the feature cache still had the screenshot
    with_reuse = int(reused.headers["x-qvl-prefill-tokens"])
    without = int(rebuilt.headers["x-qvl-prefill-tokens"])
    assert 0 < with_reuse < without
    assert reused.parse().usage.prompt_tokens_details.cached_tokens > 0
    print(f"\nfollow-up prefill tokens: {with_reuse} with reuse, {without} without")


def test_remote_engine_end_to_end_with_a_reusing_follow_up(server):
    engine = RemoteEngine(server, api_key=TOKEN)  # default model id: resolved to the served one
    shot = Screenshot(bytes((40, 160, 90, 0)) * (80 * 60), 80, 60, "BGRA")
    session = engine.open_session([shot])
    short = GenerationOptions(max_new_tokens=12)
    answer = "".join(session.ask("What is this?", options=short))
    assert session.last_stats.vision == "miss" and session.last_stats.decode_tokens >= 1
    assert session.turns[0].reply == answer  # the conversation keeps exactly what streamed
    session.complete("Tell me more.", options=short)
    stats = session.last_stats
    assert stats.vision == "hit" and stats.cached_tokens > 0 and stats.prefill_tokens < stats.prompt_tokens
    engine.close()


def test_32_concurrent_clients_get_their_own_answers(server):
    """Every reply equals what a single client gets for the same request (greedy decoding): a reply
    crossing to another request, or a session shared between two, would show as a mismatch.

    Concurrent requests decode in one batched step, whose attention rounds differently from a lone
    turn's (~1e-6 in fp32), so a greedy pick between two logits closer than that may flip. These
    questions keep every step's top-two gap above 5e-4 in the tiny model (checked with a teacher-forced
    forward); `n * 31` had a 1.4e-6 tie that flipped."""
    requests = {
        (n, k): {
            "messages": [
                question(
                    f"client {n} asks question {k}: what is at {n * 41 % 997}?",
                    (n * 8 % 256, k * 60, 255 - n * 8 % 256),
                )
            ],
            "max_tokens": 8,
            "temperature": 0,
            "stream": k == 1,
        }
        for n in range(32)
        for k in range(3)
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def text_of(response: httpx.Response, stream: bool) -> str:
        assert response.status_code == 200, response.text
        if not stream:
            return response.json()["choices"][0]["message"]["content"]
        import json

        chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])

    with httpx.Client(timeout=120, headers=headers) as http:
        reference = {
            key: text_of(http.post(server + "/v1/chat/completions", json=body), body["stream"])
            for key, body in requests.items()
        }
    assert len(set(reference.values())) > len(reference) // 4  # replies differ enough to tell them apart

    latencies: list[float] = []
    refused = 0

    async def client(n: int, http: httpx.AsyncClient) -> dict:
        nonlocal refused
        got = {}
        for k in range(3):
            body = requests[(n, k)]
            start = time.perf_counter()
            response = await http.post(server + "/v1/chat/completions", json=body)
            if response.status_code == 429:
                refused += 1
                assert response.json()["error"]["code"] == "rate_limit_exceeded"
                continue
            got[(n, k)] = text_of(response, body["stream"])
            latencies.append(time.perf_counter() - start)
        return got

    async def main():
        async with httpx.AsyncClient(timeout=300, headers=headers, limits=httpx.Limits(max_connections=64)) as http:
            return await asyncio.gather(*(client(n, http) for n in range(32)))

    start = time.perf_counter()
    results = asyncio.run(main())
    elapsed = time.perf_counter() - start
    answers = {key: text for got in results for key, text in got.items()}
    assert len(answers) + refused == len(requests) and len(answers) >= len(requests) // 2
    for key, text in answers.items():
        assert text == reference[key], key
    lat = sorted(latencies)
    p50, p99 = statistics.median(lat) * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    rate = len(answers) / elapsed
    print(f"\n{len(answers)} answered, {refused} refused in {elapsed:.2f} s: {rate:.1f} req/s, ", end="")
    print(f"p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    assert httpx.get(server + "/health").json()["status"] == "ok"
    metrics = httpx.get(server + "/metrics", headers=headers).text
    assert 'qvl_vision_features_total{result="hit"}' in metrics and "qvl_queue_depth 0" in metrics
    hits = next(line for line in metrics.splitlines() if line.startswith("qvl_feature_cache_hits_total "))
    assert float(hits.split()[1]) > 0  # the reference pass encoded every image; the loaded pass reused them


def test_min_tokens_equal_to_max_tokens_gives_exactly_that_many_tokens(server):
    """The tiny random model ends this greedy reply at an end token after a few tokens; with vLLM's
    `min_tokens` it writes exactly `max_tokens`, streaming as a benchmark does, its text starting with
    the short reply (only the end tokens were refused)."""
    client = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN)
    messages = [{"role": "user", "content": "Question 1: say something."}]
    short = client.chat.completions.create(model="", messages=messages, max_tokens=24, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 24
    stream = client.chat.completions.create(
        model="",
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 24},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 24
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(short.choices[0].message.content) and len(text) > len(short.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="", messages=messages, max_tokens=4, extra_body={"min_tokens": 5})
    assert err.value.body["param"] == "min_tokens"


def test_a_cache_salt_keeps_vision_features_apart(server):
    """The same screenshot under another cache_salt is encoded anew (`x-qvl-vision: miss`): a client cannot
    learn from a hit that another client sent that image."""
    import httpx

    shot = question("What is on this screen?", (7, 99, 140))

    def vision(salt):
        body = {"messages": [shot], "max_tokens": 2, "cache_salt": salt}
        reply = httpx.post(server + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                           timeout=120)  # fmt: skip
        assert reply.status_code == 200, reply.text
        return reply.headers["x-qvl-vision"]

    assert vision("alice") == "miss"
    assert vision("alice") == "hit"
    assert vision("bob") == "miss"
