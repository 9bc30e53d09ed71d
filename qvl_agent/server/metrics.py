"""Server metrics with `prometheus_client`, one registry per app, and the middleware that counts requests.

`RequestMetrics` is the one ASGI middleware that counts every response by endpoint and status code.
Endpoints are the server's own routes; every other path counts as `other`, so a scan of unique paths
cannot grow the output (and label values are escaped by the library). Gauges that describe live state
(queue depth, running generations, pooled sessions, the decode batch) and the engine's feature-cache
counters are read from callables at scrape time; so is the histogram of decode steps by batch size.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 400, 800, 1600)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER_ENDPOINT = "other"
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
RATE_WINDOW_S = 10.0  # the all-streams tokens/s gauge counts replies finished this recently

Live = dict[str, tuple[str, Callable[[], float]]]  # name -> (help, read)


class _LiveValues(Collector):
    def __init__(self, gauges: Live, counters: Live):
        self.gauges, self.counters = gauges, counters

    def collect(self):
        for name, (help_text, read) in self.gauges.items():
            yield GaugeMetricFamily(name, help_text, value=read())
        for name, (help_text, read) in self.counters.items():
            yield CounterMetricFamily(name.removesuffix("_total"), help_text, value=read())


class _BatchSizes(Collector):
    """The engine's decode steps by how many streams each carried, as a histogram."""

    def __init__(self, steps: collections.Counter):
        self.steps = steps

    def collect(self):
        while True:  # a snapshot: the batch thread may add a new size meanwhile
            try:
                counts = dict(self.steps)
                break
            except RuntimeError:
                continue
        buckets = [(str(b), sum(n for size, n in counts.items() if size <= b)) for b in BATCH_BUCKETS]
        buckets.append(("+Inf", sum(counts.values())))
        yield HistogramMetricFamily(
            "qvl_decode_batch_size",
            "Decode steps by how many streams decoded together in them.",
            buckets=buckets,
            sum_value=sum(size * n for size, n in counts.items()),
        )


class TokenRate:
    """Generated tokens per second over all streams, from the replies finished in the last window."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._done: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, tokens: int) -> None:
        with self._lock:
            self._done.append((time.monotonic(), tokens))

    def per_second(self) -> float:
        cutoff = time.monotonic() - self.window_s
        with self._lock:
            while self._done and self._done[0][0] < cutoff:
                self._done.popleft()
            return sum(n for _, n in self._done) / self.window_s


class Metrics:
    """What `GET /metrics` reports."""

    def __init__(
        self,
        endpoints: set[str],
        gauges: Live | None = None,
        counters: Live | None = None,
        batch_sizes: collections.Counter | None = None,
    ):
        self.endpoints = endpoints
        self.rate = TokenRate()
        gauges = dict(gauges or {})
        gauges["qvl_tokens_per_second"] = (
            f"Generated tokens per second, all streams, over the last {RATE_WINDOW_S:g} s.",
            self.rate.per_second,
        )
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "qvl_requests", "HTTP requests by endpoint and status code.", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "qvl_request_latency_seconds",
            "Chat completion latency, request to last token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "qvl_time_to_first_token_seconds", "Engine time to first token.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.tokens_per_s = Histogram(
            "qvl_decode_tokens_per_second", "Decode speed per generation.", buckets=RATE_BUCKETS, registry=r
        )
        self.vision = Counter(
            "qvl_vision_features",
            "Generations by where image features came from (hit: cache or reused session).",
            ["result"],
            registry=r,
        )
        self.session_reuse = Counter(
            "qvl_session_reuse", "Generations that continued a pooled session.", ["result"], registry=r
        )
        for result in ("hit", "miss", "none"):
            self.vision.labels(result)
        for result in ("reused", "new"):
            self.session_reuse.labels(result)
        self.tokens = {
            key: Counter(f"qvl_{key}_tokens", help_text, registry=r)
            for key, help_text in (
                ("prompt", "Context tokens before each reply."),
                ("prefill", "Tokens actually prefilled."),
                ("cached", "Context tokens served from a reused KV cache."),
                ("completion", "Generated tokens."),
            )
        }
        r.register(_LiveValues(gauges, counters or {}))
        if batch_sizes is not None:
            r.register(_BatchSizes(batch_sizes))

    def count_request(self, path: str, status: int) -> None:
        endpoint = path if path in self.endpoints else OTHER_ENDPOINT
        self.requests.labels(endpoint, str(status)).inc()

    def observe_generation(self, latency_s: float, stats: dict, reused: bool) -> None:
        self.latency.observe(latency_s)
        if stats.get("ttft_ms"):
            self.ttft.observe(stats["ttft_ms"] / 1000)
        if stats.get("decode_tokens_per_s"):
            self.tokens_per_s.observe(stats["decode_tokens_per_s"])
        vision = str(stats.get("vision", "none"))
        self.vision.labels(vision if vision in ("hit", "miss") else "none").inc()
        self.session_reuse.labels("reused" if reused else "new").inc()
        for key, stat in (("prompt", "prompt"), ("prefill", "prefill"), ("cached", "cached"), ("completion", "decode")):
            self.tokens[key].inc(max(0, int(stats.get(f"{stat}_tokens", 0))))
        self.rate.add(max(0, int(stats.get("decode_tokens", 0))))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware: counts each HTTP response by endpoint and the status code it started with."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception that escapes every handler still counts, as what the client got

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.count_request(scope.get("path", ""), status)
