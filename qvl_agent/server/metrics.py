"""Server metrics in the Prometheus text exposition format (version 0.0.4), with no dependency.

Counters and histograms are updated from the event loop and read by `GET /metrics`; a lock keeps a
scrape consistent. Gauges that describe live state (queue depth, running generations, pooled
sessions) are read from callables at scrape time.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 400, 800, 1600)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.total}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.total}")
        return out


class Metrics:
    """What `GET /metrics` reports."""

    def __init__(
        self,
        gauges: dict[str, tuple[str, Callable[[], float]]] | None = None,
        counters: dict[str, tuple[str, Callable[[], float]]] | None = None,
    ):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (endpoint, status) -> count
        self.latency = Histogram(LATENCY_BUCKETS)
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.tokens_per_s = Histogram(RATE_BUCKETS)
        self.vision: dict[str, int] = defaultdict(int)  # hit / miss / none
        self.session_reuse: dict[str, int] = defaultdict(int)  # reused / new
        self.prompt_tokens = 0
        self.prefill_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.gauges = gauges or {}
        self.counters = counters or {}  # read from the engine at scrape time (its feature cache)

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def observe_generation(self, latency_s: float, stats: dict, reused: bool) -> None:
        with self._lock:
            self.latency.observe(latency_s)
            if stats.get("ttft_ms"):
                self.ttft.observe(stats["ttft_ms"] / 1000)
            if stats.get("decode_tokens_per_s"):
                self.tokens_per_s.observe(stats["decode_tokens_per_s"])
            self.vision[str(stats.get("vision", "none"))] += 1
            self.session_reuse["reused" if reused else "new"] += 1
            self.prompt_tokens += int(stats.get("prompt_tokens", 0))
            self.prefill_tokens += int(stats.get("prefill_tokens", 0))
            self.cached_tokens += int(stats.get("cached_tokens", 0))
            self.completion_tokens += int(stats.get("decode_tokens", 0))

    def render(self) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        with self._lock:
            family("qvl_requests_total", "counter", "HTTP requests by endpoint and status code.")
            for (endpoint, status), n in sorted(self.requests.items()):
                out.append(f'qvl_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            family("qvl_request_latency_seconds", "histogram", "Chat completion latency, request to last token.")
            out += self.latency.lines("qvl_request_latency_seconds")
            family("qvl_time_to_first_token_seconds", "histogram", "Engine time to first token.")
            out += self.ttft.lines("qvl_time_to_first_token_seconds")
            family("qvl_decode_tokens_per_second", "histogram", "Decode speed per generation.")
            out += self.tokens_per_s.lines("qvl_decode_tokens_per_second")
            family(
                "qvl_vision_features_total",
                "counter",
                "Generations by where image features came from (hit: cache or reused session).",
            )
            for result in ("hit", "miss", "none"):
                out.append(f'qvl_vision_features_total{{result="{result}"}} {self.vision[result]}')
            family("qvl_session_reuse_total", "counter", "Generations that continued a pooled session.")
            for result in ("reused", "new"):
                out.append(f'qvl_session_reuse_total{{result="{result}"}} {self.session_reuse[result]}')
            for name, value, help_text in (
                ("qvl_prompt_tokens_total", self.prompt_tokens, "Context tokens before each reply."),
                ("qvl_prefill_tokens_total", self.prefill_tokens, "Tokens actually prefilled."),
                (
                    "qvl_cached_tokens_total",
                    self.cached_tokens,
                    "Context tokens served from a reused KV cache.",
                ),
                ("qvl_completion_tokens_total", self.completion_tokens, "Generated tokens."),
            ):
                family(name, "counter", help_text)
                out.append(f"{name} {value}")
        for kind, live in (("gauge", self.gauges), ("counter", self.counters)):
            for name, (help_text, read) in live.items():
                family(name, kind, help_text)
                out.append(f"{name} {read():g}")
        return "\n".join(out) + "\n"
