#!/usr/bin/env python3
"""Load figures for `qvl-agent serve`: N clients at once, each streaming a reply about its own screenshot.

usage: python scripts/serve_bench.py --model DIR [--device cuda] [--clients 1,4,16,64] [--max-tokens 256]
                                     [--screen 1920x1080] [--follow-up] [--max-batch 16,1] [--json FILE]
       python scripts/serve_bench.py --shape 2b --device cuda ...   (random weights in the real 2B shape)
       python scripts/serve_bench.py --url http://127.0.0.1:8000 --token TOKEN ...  (or $QVL_API_TOKEN)

Without --url it starts `qvl-agent serve --port 0` once per --max-batch value (so batching on and off run
side by side on the same machine) and stops it afterwards. Every client sends a new screenshot that
looks like a desktop and asks for exactly --max-tokens tokens (vLLM's `min_tokens`, so a random-weight
model does not stop early), streaming; with --follow-up it then asks a follow-up in the same
conversation, which should reuse the first reply's KV. Per round it prints aggregate decode tokens/s
(all streams' tokens over the round's wall time), per-stream tokens/s (from the arrival of a stream's
first text to that of its last), time to first token p50/p95 (request sent -> first text arrived), the
slowest reply, the mean batch the replies decoded in, lost replies (an error, or not exactly --max-tokens
tokens) and mixed ones (a reply that differs from the same request sent alone afterwards, for the first
--check requests; on bf16 a near-tie may round either way between a batched and a lone step, so count
those against an fp32 run before calling them a bug). Replies whose tokens have no text (a model whose
vocabulary is wider than its tokenizer) cannot be timed on arrival: they are counted apart, never as a
first token at the end of the reply; so are replies whose whole text came in one chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # qvl_agent and tests.support, from a checkout

FOLLOW_UP = "And what is the title of the window in front?"


def screenshot_url(seed: int, width: int, height: int) -> str:
    from qvl_agent.devtools.screens import ui_screenshot  # numpy: only once the arguments are good

    return "data:image/png;base64," + base64.b64encode(ui_screenshot(seed, width, height).to_png()).decode()


def first_question(n: int, image_url: str, max_tokens: int, min_tokens: bool) -> dict:
    content = [
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "text", "text": f"Client {n}: what is on this screen, and what should I click next?"},
    ]
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return body | ({"min_tokens": max_tokens} if min_tokens else {})


def follow_up(body: dict, reply: str) -> dict:
    messages = [*body["messages"], {"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
    return body | {"messages": messages}


@dataclass
class Reply:
    text: str = ""
    tokens: int = 0
    sent: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # when each chunk with text arrived
    done: float = 0.0
    stats: dict = field(default_factory=dict)  # the server's own figures (`qvl` in the finish chunk)
    error: str = ""

    @property
    def textless(self) -> bool:
        """Tokens came but no text: nothing to time a first token by."""
        return not self.error and self.tokens > 0 and not self.arrivals

    @property
    def one_chunk(self) -> bool:
        """The whole text of a reply of several tokens came at once: it was not streamed."""
        return self.tokens > 1 and len(self.arrivals) == 1

    @property
    def ttft(self) -> float | None:
        """Request sent -> its first text arrived; None when no text came."""
        return self.arrivals[0] - self.sent if self.arrivals else None

    @property
    def stream_rate(self) -> float | None:
        """Tokens per second from the first text's arrival to the last's: what this person sees the reply
        stream at. None when there is no span to measure (no text, or all of it in one chunk)."""
        if len(self.arrivals) < 2 or self.arrivals[-1] <= self.arrivals[0]:
            return None
        return (self.tokens - 1) / (self.arrivals[-1] - self.arrivals[0])


async def stream(http: httpx.AsyncClient, url: str, body: dict) -> Reply:
    reply = Reply(sent=time.perf_counter())
    try:
        async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                reply.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return reply
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    reply.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    piece = choice["delta"].get("content")
                    if piece:
                        reply.arrivals.append(time.perf_counter())
                        reply.text += piece
                reply.stats = chunk.get("qvl") or reply.stats
    except httpx.HTTPError as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    reply.done = time.perf_counter()
    return reply


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


BATCH_COUNTERS = (
    "qvl_batch_prefill_seconds_total",
    "qvl_batch_decode_seconds_total",
    "qvl_decode_batch_size_count",
    "qvl_batch_ahead_steps_total",
)


async def batch_counters(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The server's batch-thread counters from /metrics (none from a server without batching)."""
    response = await http.get(url + "/metrics")
    found = {}
    for line in response.text.splitlines():
        name, _, value = line.partition(" ")
        if name in BATCH_COUNTERS:
            found[name] = float(value)
    return found


def batch_time(before: dict, after: dict, elapsed: float) -> dict:
    """Per round: the batch thread's share of the round in prefill and in decode steps, and a step's mean."""
    if not before or set(before) != set(after):
        return {}
    delta = {k: after[k] - before[k] for k in before}
    steps = delta["qvl_decode_batch_size_count"]
    return {
        "batch_prefill_share": round(delta["qvl_batch_prefill_seconds_total"] / elapsed, 3),
        "batch_decode_share": round(delta["qvl_batch_decode_seconds_total"] / elapsed, 3),
        "decode_step_ms_mean": round(1000 * delta["qvl_batch_decode_seconds_total"] / steps, 2) if steps else None,
        "ahead_share": round(delta.get("qvl_batch_ahead_steps_total", 0.0) / steps, 3) if steps else None,
    }


async def round_of(url: str, token: str, clients: int, args, seed: int) -> dict:
    """One round: `clients` conversations at once, each its first question (then its follow-up)."""
    bodies = [
        first_question(n, screenshot_url(seed + n, *args.screen), args.max_tokens, not args.no_min_tokens)
        for n in range(clients)
        for _ in range(args.requests)
    ]
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=len(bodies) + 4)
    async with httpx.AsyncClient(timeout=900, headers=headers, limits=limits) as http:

        async def conversation(body: dict) -> tuple[Reply, Reply | None]:
            first = await stream(http, url, body)
            if not args.follow_up or first.error:
                return first, None
            return first, await stream(http, url, follow_up(body, first.text))

        counted = await batch_counters(http, url)
        start = time.perf_counter()
        results = await asyncio.gather(*(conversation(b) for b in bodies))
        elapsed = time.perf_counter() - start
        split = batch_time(counted, await batch_counters(http, url), elapsed)
        # The reference: the first --check requests again, one at a time (their screens now cached).
        alone = [await stream(http, url, b) for b in bodies[: args.check]]
    firsts = [f for f, _ in results]
    follows = [f for _, f in results if f is not None]
    replies = firsts + follows
    lost = [r for r in replies if r.error or (not args.no_min_tokens and r.tokens != args.max_tokens)]
    good = [r for r in replies if r not in lost]
    # Empty texts would agree whatever the tokens: only replies with text are compared.
    compared = [(a, r) for a, r in zip(alone, firsts, strict=False) if a.error == "" and (a.text or r.text)]
    mixed = sum(a.text != r.text for a, r in compared)
    rates = [r.stream_rate for r in good if r.stream_rate is not None]
    ttfts = [r.ttft for r in firsts if r.ttft is not None]
    follow_ttfts = [r.ttft for r in follows if r.ttft is not None]

    def server_p50(key: str) -> float | None:  # the server's own account of the first turns (its `qvl` stats)
        values = [float(r.stats[key]) for r in firsts if key in r.stats]
        return round(statistics.median(values), 1) if values else None

    return {
        "clients": clients,
        "requests": len(replies),
        "seconds": round(elapsed, 3),
        "tokens": sum(r.tokens for r in good),
        "aggregate_tok_s": round(sum(r.tokens for r in good) / elapsed, 1),
        "stream_tok_s_min": round(min(rates), 1) if rates else None,
        "stream_tok_s_p50": round(statistics.median(rates), 1) if rates else None,
        "ttft_ms_p50": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
        "ttft_ms_p95": round(percentile(ttfts, 0.95) * 1000, 1) if ttfts else None,
        "follow_up_ttft_ms_p50": round(statistics.median(follow_ttfts) * 1000, 1) if follow_ttfts else None,
        # Where a first token's time went, by the server: waiting for a generation slot, decoding the
        # image, the vision tower, and the engine's own first token (its turn queued, prefilled, first pick).
        "server_queue_ms_p50": server_p50("queue_ms"),
        "preprocess_ms_p50": server_p50("preprocess_ms"),
        "vision_ms_p50": server_p50("vision_ms"),
        "engine_ttft_ms_p50": server_p50("ttft_ms"),
        **split,
        "follow_up_cached_tokens_min": min((int(r.stats.get("cached_tokens", 0)) for r in follows), default=0),
        "slowest_reply_s": round(max((r.done - r.sent for r in replies), default=0), 3),
        "decode_batch_mean": round(statistics.mean([float(r.stats.get("decode_batch", 1)) for r in good] or [1]), 2),
        "lost": len(lost),
        "errors": sorted({r.error for r in lost if r.error})[:3],
        "checked": len(compared),
        "mixed": mixed,
        "textless": sum(r.textless for r in replies),
        "one_chunk": sum(r.one_chunk for r in replies),
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def print_round(max_batch: str, row: dict) -> None:
    print(
        f"max-batch {max_batch:>3} | {row['clients']:>3} clients | {row['aggregate_tok_s']:>8.1f} tok/s all "
        f"| per stream min {_rate(row['stream_tok_s_min'])} p50 {_rate(row['stream_tok_s_p50'])} tok/s "
        f"| first token p50 {_ms(row['ttft_ms_p50'])} p95 {_ms(row['ttft_ms_p95'])} ms "
        f"| follow-up p50 {_ms(row['follow_up_ttft_ms_p50'])} ms | slowest {row['slowest_reply_s']:.2f} s "
        f"| batch {row['decode_batch_mean']:.1f} | lost {row['lost']} mixed {row['mixed']}/{row['checked']}",
        flush=True,
    )
    if row["engine_ttft_ms_p50"] is not None:
        print(
            f"  first token by the server, p50: queue {_ms(row['server_queue_ms_p50'])} ms, image "
            f"{_ms(row['preprocess_ms_p50'])} ms, vision {_ms(row['vision_ms_p50'])} ms, engine (queued + "
            f"prefilled + first pick) {_ms(row['engine_ttft_ms_p50'])} ms",
            flush=True,
        )
    if row.get("decode_step_ms_mean") is not None:
        print(
            f"  the batch thread: {100 * row['batch_prefill_share']:.0f}% of the round prefilling, "
            f"{100 * row['batch_decode_share']:.0f}% in decode steps ({row['decode_step_ms_mean']:.1f} ms a step "
            f"with the picks and each stream's piece; {100 * (row.get('ahead_share') or 0):.0f}% of the steps ran "
            "ahead of the host)",
            flush=True,
        )
    if row["textless"]:
        print(
            f"  {row['textless']} of {row['requests']} replies had tokens but no text, so their first token cannot "
            "be timed on arrival: the model picks ids its tokenizer has no text for (a random model whose "
            "vocabulary is wider than its tokenizer; build it with --shape, which widens the tokenizer).",
            flush=True,
        )
    if row["one_chunk"]:
        print(f"  {row['one_chunk']} replies came in one chunk: the server did not stream them.", flush=True)


async def until_compiled(url: str, token: str, args, limit_s: float = 420) -> None:
    """Short requests until the server's decode path is no longer being compiled in the background (its
    `qvl` stats say "compiled", or why not), so the rounds time what a warm server runs. A lone request
    that went through the batch ("batched") says nothing of the compile: the build, which takes the model
    between two tokens to install what it compiled, made it share; ask again."""
    t0 = time.perf_counter()
    body = first_question(0, screenshot_url(10_000, *args.screen), 4, True)
    path = ""
    async with httpx.AsyncClient(timeout=900, headers={"Authorization": f"Bearer {token}"}) as http:
        while time.perf_counter() - t0 < limit_s:
            path = str((await stream(http, url, body)).stats.get("decode_path", ""))
            if not path.startswith("compiling") and path != "batched":
                break
            await asyncio.sleep(2)
    print(f"decode path: {path or 'not reported'} (waited {time.perf_counter() - t0:.1f} s)", flush=True)


async def bench(url: str, token: str, args, max_batch: str) -> list[dict]:
    url = url.rstrip("/")
    await until_compiled(url, token, args)
    await round_of(url, token, 1, args, seed=10_000)  # warm-up: not counted
    rows = []
    for k, clients in enumerate(args.clients):
        row = await round_of(url, token, clients, args, seed=100_000 * (k + 1))  # new screens every round
        row["max_batch"] = max_batch
        print_round(max_batch, row)
        rows.append(row)
    return rows


def numbers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1,4,16, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every number must be at least 1, not {text!r}")
    return values


def screen_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT like 1920x1080, not {text!r}") from None
    if not (320 <= width <= 8192 and 200 <= height <= 8192):  # room for the drawn desktop's panels
        raise argparse.ArgumentTypeError(f"the screen must be 320x200 to 8192x8192 pixels, not {text!r}")
    return width, height


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="MODEL", help="model directory or id to serve (when no --url is given)")
    parser.add_argument(
        "--shape",
        choices=("tiny", "tiny-4b", "tiny-8b", "2b"),
        help="instead of --model: random weights of this shape (2b: the real Qwen3-VL-2B), built on --device",
    )
    parser.add_argument("--device", default="cpu", metavar="DEVICE")
    parser.add_argument("--url", metavar="URL", help="an already running server")
    # serve refuses tokens under 16 characters: the default is a fresh one of 32 (or the person's own).
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        default=os.environ.get("QVL_API_TOKEN") or secrets.token_urlsafe(24),
        help="the API token: $QVL_API_TOKEN when set, else a fresh random one for the server this script starts",
    )
    parser.add_argument("--clients", type=numbers, default=[1, 4, 16, 64], metavar="N,N", help="one round per number")
    parser.add_argument("--requests", type=int, default=1, metavar="N", help="conversations per client and round")
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="tokens per reply")
    parser.add_argument("--screen", type=screen_size, default=(1920, 1080), metavar="WxH", help="screenshot size")
    parser.add_argument("--follow-up", action="store_true", help="each client then asks a follow-up")
    parser.add_argument(
        "--max-batch", type=numbers, default=[16, 1], metavar="N,N", help="one server per number (not with --url)"
    )
    parser.add_argument("--check", type=int, default=4, metavar="N", help="requests per round compared with alone")
    parser.add_argument("--no-min-tokens", action="store_true", help="for servers without vLLM's min_tokens")
    parser.add_argument("--json", metavar="FILE", help="also write every round's figures here")
    return parser


def random_model(shape: str, device: str) -> str:
    """A random-weight model of `shape` in a temporary folder, built in a child process so that this one
    holds no GPU memory while the server runs."""
    import subprocess

    path = tempfile.mkdtemp(prefix="qvl-serve-bench-")
    code = (
        "import sys, torch; from pathlib import Path; from qvl_agent.devtools.bench import build_model_dir; "
        "build_model_dir(sys.argv[1], Path(sys.argv[2]), torch.device(sys.argv[3]))"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code, shape, path, device], check=True, cwd=root)
    print(f"random weights, {shape} shape, in {path}", flush=True)
    return path


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.url and not args.model and not args.shape:
        parser.error("give --model DIR or --shape SHAPE (to start a server) or --url")
    if args.shape and not args.model and not args.url:
        args.model = random_model(args.shape, args.device)
    from tests.support.live_server import start_serve, stop_serve  # uvicorn: only once the arguments are good

    rows: list[dict] = []
    if args.url:
        rows += asyncio.run(bench(args.url, args.token, args, "?"))
    for max_batch in [] if args.url else args.max_batch:
        queue = str(max(args.clients) * args.requests * 2 + 8)
        url, proc, _ = start_serve(
            *("--model", args.model, "--device", args.device, "--max-queue", queue, "--max-batch", str(max_batch)),
            config_dir=tempfile.mkdtemp(),
            token=args.token,
            timeout=900,
        )
        try:
            rows += asyncio.run(bench(url, args.token, args, str(max_batch)))
        finally:
            stop_serve(proc)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows}, indent=2) + "\n")
    return 1 if any(r["lost"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
