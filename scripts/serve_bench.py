#!/usr/bin/env python3
"""Load figures for `qvl-agent serve`: requests/s and p50/p99 latency with concurrent clients, and a
stateless follow-up's prefill tokens with and without session reuse.

usage: python scripts/serve_bench.py --model DIR [--clients 32] [--requests 3] [--max-tokens 8]
       python scripts/serve_bench.py --url http://127.0.0.1:8000 --token TOKEN ...  (or $QVL_API_TOKEN)

Without --url it starts `qvl-agent serve --port 0` with the model on the CPU (--device to change) and
stops it afterwards. Each request carries its own small image and a distinct question.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.live_server import start_serve, stop_serve  # noqa: E402


def png_url(color, size=(96, 64)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def body(n: int, k: int, max_tokens: int) -> dict:
    content = [
        {"type": "image_url", "image_url": {"url": png_url((n * 8 % 256, k * 60 % 256, 200))}},
        {"type": "text", "text": f"client {n} asks question {k}: what is on this screen?"},
    ]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def load(url: str, token: str, clients: int, per_client: int, max_tokens: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    refused = 0

    async def client(n: int, http: httpx.AsyncClient) -> None:
        nonlocal refused
        for k in range(per_client):
            start = time.perf_counter()
            r = await http.post(url + "/v1/chat/completions", json=body(n, k, max_tokens))
            if r.status_code == 429:
                refused += 1
                continue
            r.raise_for_status()
            latencies.append(time.perf_counter() - start)

    limits = httpx.Limits(max_connections=clients * 2)
    async with httpx.AsyncClient(timeout=600, headers=headers, limits=limits) as http:
        await client(-1, http)  # warm-up, not counted
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*(client(n, http) for n in range(clients)))
        elapsed = time.perf_counter() - start
    rate, p50, p99 = len(latencies) / elapsed, statistics.median(latencies), percentile(latencies, 0.99)
    print(
        f"{clients} clients x {per_client} requests: {len(latencies)} answered, {refused} refused (429) in "
        f"{elapsed:.2f} s -> {rate:.2f} req/s, p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
    )


def reuse(url: str, token: str, max_tokens: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=600, headers=headers) as http:
        history = body(999, 0, max_tokens)["messages"]
        first = http.post(url + "/v1/chat/completions", json={"messages": history, "max_tokens": max_tokens})
        history += [
            {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And what colour is it?"},
        ]
        follow = {"messages": history, "max_tokens": max_tokens}
        reused = http.post(url + "/v1/chat/completions", json=follow)
        rebuilt = http.post(url + "/v1/chat/completions", json=follow)  # nothing pooled holds this history now
        for label, r in (("with reuse", reused), ("without reuse", rebuilt)):
            usage = r.json()["usage"]
            print(
                f"follow-up {label}: prefill {r.headers['x-qvl-prefill-tokens']} of {usage['prompt_tokens']} "
                f"prompt tokens (cached {usage['prompt_tokens_details']['cached_tokens']}), "
                f"vision {r.headers['x-qvl-vision']}, ttft {r.json()['qvl']['ttft_ms']:.1f} ms"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="MODEL", help="model directory or id to serve (when no --url is given)")
    parser.add_argument("--device", default="cpu", metavar="DEVICE")
    parser.add_argument("--url", metavar="URL", help="an already running server")
    # serve refuses tokens under 16 characters: the default is a fresh one of 32 (or the person's own).
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        default=os.environ.get("QVL_API_TOKEN") or secrets.token_urlsafe(24),
        help="the API token: $QVL_API_TOKEN when set, else a fresh random one for the server this script starts",
    )
    parser.add_argument("--clients", type=int, default=32, metavar="N")
    parser.add_argument("--requests", type=int, default=3, metavar="N", help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=8, metavar="N")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    proc = None
    url = args.url
    if not url:
        if not args.model:
            parser.error("give --model DIR (to start a server) or --url")
        extra = ("--max-queue", str(args.clients * 2))
        url, proc, _ = start_serve(
            "--model",
            args.model,
            "--device",
            args.device,
            *extra,
            config_dir=tempfile.mkdtemp(),
            token=args.token,
        )
    try:
        asyncio.run(load(url.rstrip("/"), args.token, args.clients, args.requests, args.max_tokens))
        reuse(url.rstrip("/"), args.token, args.max_tokens)
    finally:
        if proc is not None:
            stop_serve(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
