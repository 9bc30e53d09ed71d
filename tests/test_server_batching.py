"""`qvl-agent serve --max-batch N` with the tiny random Qwen3-VL on CPU: concurrent clients decode in one
batched step, each gets exactly the reply it gets alone (`--max-batch 1`), and the server says so in
its response headers and `/metrics`."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import pytest
from PIL import Image

from tests.conftest import run_cli
from tests.support.live_server import start_serve, stop_serve

pytestmark = pytest.mark.slow
TOKEN = "tiny-test-token-0123"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _png_url(color) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (80, 56), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _body(n: int) -> dict:
    content = [
        {"type": "image_url", "image_url": {"url": _png_url((n * 40 % 256, 90, 255 - n * 30 % 256))}},
        {"type": "text", "text": f"client {n}: what is on this screen?"},
    ]
    # Different lengths, so streams leave the batch at different steps.
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24 + 6 * n,
        "temperature": 0,
        "stream": n % 2 == 1,
    }


def _reply(response: httpx.Response) -> tuple[str, dict]:
    """(text, the qvl stats) of a streamed or plain completion."""
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        return text, next(c["qvl"] for c in reversed(chunks) if "qvl" in c)
    body = response.json()
    return body["choices"][0]["message"]["content"], body["qvl"]


async def _all_at_once(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=300, headers=HEADERS) as http:
        return await asyncio.gather(*(http.post(url + "/v1/chat/completions", json=_body(i)) for i in range(n)))


ROWS, QUEUE = 4, 2  # the shared batched server's --max-batch and --max-queue


def _serve(tiny_model_dir, tmp_path_factory, max_batch: str, *more: str):
    config = tmp_path_factory.mktemp(f"serve-batch-{max_batch}")
    args = ("--model", str(tiny_model_dir), "--device", "cpu", "--max-batch", max_batch, *more)
    url, proc, printed = start_serve(*args, config_dir=config, token=TOKEN)
    # The person is told how many requests will decode together.
    said = {"1": "Batching: off (--max-batch 1)", "4": "Batching: up to 4 requests decode together."}
    assert any(line.startswith(said[max_batch]) for line in printed), printed
    return url, proc


@pytest.fixture(scope="module")
def alone(tiny_model_dir, tmp_path_factory):
    """`serve --max-batch 1`: one request generates at a time."""
    url, proc = _serve(tiny_model_dir, tmp_path_factory, "1")
    yield url
    assert stop_serve(proc) == 0


@pytest.fixture(scope="module")
def batched(tiny_model_dir, tmp_path_factory):
    """`serve --max-batch 4 --max-queue 2`: four requests decode together and two more may wait. The tests of
    this module share it; each one waits for all its answers, so the next finds nothing running."""
    url, proc = _serve(tiny_model_dir, tmp_path_factory, str(ROWS), "--max-queue", str(QUEUE))
    yield url
    assert stop_serve(proc) == 0


@pytest.mark.same_worker
def test_concurrent_clients_decode_together_and_each_gets_its_own_answer(alone, batched):
    clients = ROWS + QUEUE
    solo = asyncio.run(_all_at_once(alone, clients))
    metrics = httpx.get(alone + "/metrics", headers=HEADERS).text
    reference = [_reply(r) for r in solo]
    assert all(stats["decode_batch"] == 1.0 for _, stats in reference)  # batching off: one at a time
    assert all(r.headers.get("x-qvl-decode-batch") in (None, "1.0") for r in solo)
    assert "qvl_decode_batch_size" not in metrics

    together = asyncio.run(_all_at_once(batched, clients))
    metrics = httpx.get(batched + "/metrics", headers=HEADERS).text
    again = [
        _reply(httpx.post(batched + "/v1/chat/completions", json=_body(i), headers=HEADERS, timeout=120))
        for i in (0, 3)
    ]
    replies = [_reply(r) for r in together]
    for i, ((text, stats), (ref_text, ref_stats)) in enumerate(zip(replies, reference, strict=True)):
        assert text == ref_text, f"client {i}: its batched reply differs from its reply alone"
        assert stats["decode_tokens"] == ref_stats["decode_tokens"]
        assert stats["decode_batch_max"] <= ROWS  # never more rows than --max-batch
    assert max(stats["decode_batch_max"] for _, stats in replies) >= 2, "no two requests ever decoded together"
    for response, (_, stats) in zip(together, replies, strict=True):
        if not response.headers["content-type"].startswith("text/event-stream"):
            assert float(response.headers["x-qvl-decode-batch"]) == stats["decode_batch"]

    # Counted since the server started, so with the other tests' steps too: some steps had company, none had
    # more than --max-batch rows, and nothing is left decoding or waiting.
    lines = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("qvl_")}
    steps = lines["qvl_decode_batch_size_count"]
    alone_steps = lines['qvl_decode_batch_size_bucket{le="1"}']
    assert steps > alone_steps and lines['qvl_decode_batch_size_bucket{le="4"}'] == steps
    assert lines["qvl_batch_decoding"] == 0 and lines["qvl_batch_waiting"] == 0  # all answered
    assert lines["qvl_tokens_per_second"] > 0
    # Where the batch thread's time went: some in prefilling the prompts, some in the decode steps
    assert lines["qvl_batch_prefill_seconds_total"] > 0 and lines["qvl_batch_decode_seconds_total"] > 0
    assert 0 < lines["qvl_batch_ahead_steps_total"] < steps  # greedy steps ran ahead of the host, not all
    assert "qvl_batch_prefill_seconds" not in httpx.get(alone + "/metrics", headers=HEADERS).text
    # A lone request afterwards still answers exactly as before.
    assert [text for text, _ in again] == [reference[0][0], reference[3][0]]


@pytest.mark.parametrize("value", ["0", "65", "many"])
def test_a_max_batch_out_of_range_is_one_sentence_and_exit_2(value, tmp_path):
    r = run_cli("serve", "--port", "0", "--max-batch", value, env={"QVL_CONFIG_DIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 2
    assert "--max-batch" in r.stderr and "Traceback" not in r.stderr


def test_serve_bench_runs_batched_and_alone_side_by_side(tiny_model_dir, tmp_path):
    """`scripts/serve_bench.py` as the GPU measurement runs it, small: every reply has exactly the
    tokens asked for (min_tokens), none lost or mixed, follow-ups reuse their KV, both servers reported."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "bench.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "serve_bench.py"
    argv = ["--model", str(tiny_model_dir), "--clients", "1,3", "--max-tokens", "10", "--screen", "320x200"]
    argv += ["--follow-up", "--max-batch", "4,1", "--check", "3", "--json", str(out)]
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rounds = json.loads(out.read_text())["rounds"]
    assert [(row["max_batch"], row["clients"]) for row in rounds] == [("4", 1), ("4", 3), ("1", 1), ("1", 3)]
    for row in rounds:
        assert row["lost"] == 0 and row["mixed"] == 0 and row["checked"] == row["clients"]
        assert row["tokens"] == row["clients"] * 2 * 10  # first questions and follow-ups, 10 tokens each
        assert row["follow_up_cached_tokens_min"] > 0 and row["aggregate_tok_s"] > 0
        # Timed on the arrival of text: every reply had some, in more than one chunk.
        assert row["textless"] == 0 and row["one_chunk"] == 0 and row["ttft_ms_p50"] > 0
        assert row["stream_tok_s_min"] > 0
    assert all(row["decode_batch_mean"] == 1 for row in rounds if row["max_batch"] == "1")
    assert r.stdout.count("max-batch") == 4
    # The server's own account of each round: where first tokens went, and the batch thread's time
    assert all(row["engine_ttft_ms_p50"] > 0 and row["vision_ms_p50"] >= 0 for row in rounds)
    [together] = [row for row in rounds if row["max_batch"] == "4" and row["clients"] == 3]
    assert 0 < together["batch_decode_share"] <= 1 and together["decode_step_ms_mean"] > 0
    assert all("decode_step_ms_mean" not in row for row in rounds if row["max_batch"] == "1")  # no batch there
    assert r.stdout.count("the batch thread:") == 1 and "decode path: " in r.stdout


@pytest.mark.parametrize(
    "flag",
    [["--clients", "0"], ["--clients", "a,b"], ["--screen", "1920"], ["--screen", "100x100"], ["--max-batch", ""]],
)
def test_serve_bench_refuses_bad_arguments_in_one_line(flag):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "serve_bench.py"
    r = subprocess.run([sys.executable, str(script), "--model", "DIR", *flag], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and flag[0] in r.stderr


@pytest.mark.same_worker
def test_a_burst_fills_every_row_and_the_queue_before_anyone_gets_429(batched):
    """`--max-batch 4 --max-queue 2`: four requests decode and two wait, so a burst of six clients all get
    their answer; only a seventh and later are told to retry."""
    for _ in range(3):  # a burst at a server with nothing running, three times
        burst = asyncio.run(_all_at_once(batched, ROWS + QUEUE))
        assert [r.status_code for r in burst] == [200] * (ROWS + QUEUE), [r.text[:200] for r in burst]
    crowd = asyncio.run(_all_at_once(batched, 2 * (ROWS + QUEUE)))
    codes = [r.status_code for r in crowd]
    assert set(codes) <= {200, 429} and codes.count(200) >= ROWS + QUEUE, codes
    assert all(int(r.headers["Retry-After"]) >= 1 for r in crowd if r.status_code == 429)
    health = httpx.get(batched + "/health").json()
    assert health["queue_depth"] == 0 and health["running"] == 0


@pytest.mark.same_worker
def test_short_requests_do_not_wait_for_a_reply_too_long_for_a_row(batched):
    """A request whose context plus max_tokens does not fit a batch row decodes alone, but the batch
    keeps stepping beside it: short requests sent meanwhile are answered before the long reply ends,
    and the long reply is the one it gets with nobody else there."""
    url = batched
    long_body = {
        "messages": [{"role": "user", "content": "describe " * 3000}],  # 3,000 tokens + 1,200: no row holds it
        "max_tokens": 1200,
        "min_tokens": 1200,
        "temperature": 0,
        "stream": True,
    }

    async def scenario():
        async with httpx.AsyncClient(timeout=300, headers=HEADERS) as http:
            chat = url + "/v1/chat/completions"
            first = asyncio.get_running_loop().create_future()

            async def long_reply():
                async with http.stream("POST", chat, json=long_body) as r:
                    lines = []
                    async for line in r.aiter_lines():
                        lines.append(line)
                        if '"content": "' in line and '"content": ""' not in line and not first.done():
                            first.set_result(None)
                    return r.status_code, "\n".join(lines)

            long_task = asyncio.ensure_future(long_reply())
            await asyncio.wait_for(first, 120)  # the long reply is decoding
            shorts = await asyncio.gather(*(http.post(chat, json={**_body(i), "max_tokens": 8}) for i in range(2)))
            long_done_before = long_task.done()
            status, text = await long_task
            return shorts, long_done_before, httpx.Response(status, text=text, headers=_SSE)

    shorts, long_done_before, long_response = asyncio.run(scenario())
    alone = httpx.post(url + "/v1/chat/completions", json=long_body, headers=HEADERS, timeout=300)
    assert [r.status_code for r in shorts] == [200, 200]
    assert not long_done_before, "the short requests waited for the whole long reply"
    text, stats = _reply(long_response)
    assert stats["decode_tokens"] == 1200 and stats["decode_batch"] == 1.0
    assert text == _reply(alone)[0]


_SSE = {"content-type": "text/event-stream"}
