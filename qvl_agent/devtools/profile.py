"""Where the engine's time goes: GPU kernel time, the gaps between kernels, and host time per token.

Five phases of a real turn are profiled with torch.profiler (CUPTI on a GPU): the vision tower on a fresh
1080p screenshot, a prompt prefill with cached vision features, plain decode one step per replay, the same
decode as chains of `engine.decode_steps` greedy steps per replay (speculation off for both) and the
verify steps of a speculative tool-call reply. Each phase is marked with `record_function` around the
engine's own methods, and a kernel belongs to a phase when the runtime call that launched it (a kernel
launch or a CUDA graph replay, matched by correlation id) ran inside the mark. Per phase:

  - kernel time: the union of its kernels' intervals on the GPU,
  - gaps: the span from its first kernel's start to its last kernel's end minus the kernel time
    (launch overhead and idle GPU between kernels; near 0 when the GPU is never starved),
  - wall time per step on the host, and the top kernels by total time.

Then the decode loop's host side per token from cProfile: the graph replay call, the token choice
(argmax + the one `.tolist()` sync, so it also holds the wait for the GPU), detokenising and stop-string
checks (`TextStream.push`), drafting, and the KV bookkeeping. On a CPU (`--device cpu --model DIR`, the
tiny model) the same report is built from CPU operators, so CI keeps the script working.

This is a development tool: nothing in the runtime imports it.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from qvl_agent.config import from_environment
from qvl_agent.devtools.bench import QUESTION, TOOL_CALLS, _forced, build_model_dir, ui_screenshot
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.local_session import LocalSession
from qvl_agent.engine.qwen3vl import Qwen3VLEngine, pick_device

PHASES = ("vision", "prefill", "decode", "chain", "verify")
# Host functions of the decode loop, by the name cProfile gives them: (label, file suffix, function).
HOST_PARTS = (
    ("graph replay / forward", "local_session.py", "_run_tokens"),
    ("chained steps + their sync", "local_session.py", "_run_chain"),
    ("token choice + sync", "local_session.py", "_choices"),
    ("detokenise + stop check", "text_stream.py", "push"),
    ("drafting", "speculate.py", "propose"),
    ("KV bookkeeping", "kv_state.py", "trim"),
)


@contextmanager
def _marked(engine: Qwen3VLEngine):
    """Mark the engine's vision, prompt and token steps as profiler ranges (restored on exit)."""
    original_encode = engine.encode_images
    original_prompt = LocalSession._run_prompt
    original_tokens = LocalSession._run_tokens
    original_chain = LocalSession._run_chain

    def encode_images(shots):
        with record_function("qvl:vision"):
            return original_encode(shots)

    def run_prompt(self, target, shots, room):
        with record_function("qvl:prefill"):
            return original_prompt(self, target, shots, room)

    def run_tokens(self, ids, position):
        with record_function("qvl:decode" if len(ids) == 1 else "qvl:verify"):
            return original_tokens(self, ids, position)

    def run_chain(self, token, position, k, index, options):
        with record_function("qvl:chain"):
            return original_chain(self, token, position, k, index, options)

    engine.encode_images = encode_images
    LocalSession._run_prompt, LocalSession._run_tokens = run_prompt, run_tokens
    LocalSession._run_chain = run_chain
    try:
        yield
    finally:
        del engine.encode_images
        LocalSession._run_prompt, LocalSession._run_tokens = original_prompt, original_tokens
        LocalSession._run_chain = original_chain


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def phase_stats(trace: dict, gpu: bool, top: int = 8) -> dict[str, dict]:
    """Per phase from a Chrome trace (torch.profiler's export): steps, wall ms per step, kernel ms,
    gap ms and the top kernels. On a CPU "kernels" are the CPU operators inside the marks."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    marks = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("qvl:")]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    by_corr: dict[int, list[dict]] = defaultdict(list)
    for k in kernels:
        by_corr[k.get("args", {}).get("correlation", -1)].append(k)
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    out: dict[str, dict] = {}
    for phase in PHASES:
        ranges = [(m["ts"], m["ts"] + m["dur"]) for m in marks if m["name"] == f"qvl:{phase}"]
        if not ranges:
            continue

        def inside(event: dict, ranges=ranges) -> bool:
            return any(s <= event["ts"] <= t for s, t in ranges)

        if gpu:
            mine = [k for r in runtime if inside(r) for k in by_corr.get(r.get("args", {}).get("correlation", -2), [])]
        else:  # leaf CPU operators (no aten op inside them recorded) stand in for kernels
            mine = [op for op in cpu_ops if inside(op) and op["name"].startswith("aten::")]
        intervals = [(k["ts"], k["ts"] + k["dur"]) for k in mine]
        busy = _union_us(intervals)
        span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
        per_kernel: dict[str, list[float]] = defaultdict(list)
        for k in mine:
            per_kernel[k["name"]].append(k["dur"])
        ranked = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:top]
        steps = len(ranges)
        out[phase] = {
            "steps": steps,
            "wall_ms_per_step": sum(t - s for s, t in ranges) / steps / 1000,
            "kernel_ms_per_step": busy / steps / 1000,
            "gap_ms_per_step": max(span - busy, 0.0) / steps / 1000 if gpu else None,
            "kernels_per_step": len(mine) / steps,
            "top": [{"name": name[:90], "calls": len(d), "ms_per_step": sum(d) / steps / 1000} for name, d in ranked],
        }
    return out


def host_per_token(stats: pstats.Stats, tokens: int) -> dict[str, float]:
    """Milliseconds per decoded token spent in each of HOST_PARTS (cumulative, callees included)."""
    out = {}
    for label, suffix, func in HOST_PARTS:
        cumulative = sum(
            row[3] for (file, _, name), row in stats.stats.items() if name == func and file.endswith(suffix)
        )
        out[label] = cumulative * 1000 / max(tokens, 1)
    return out


def run(model: str | None, device: str, tokens: int, screen: tuple[int, int] = (1920, 1080), log=print) -> dict:
    dev = pick_device(device)
    tmp = None
    if model is None:
        tmp = tempfile.TemporaryDirectory(prefix="qvl-profile-")
        shape = "2b" if dev.type == "cuda" else "tiny"
        log(f"building a random Qwen3-VL ({shape} shape) in {tmp.name}")
        model = str(build_model_dir(shape, Path(tmp.name), dev))
    engine = Qwen3VLEngine.load(model, device=str(dev), settings=from_environment(feature_cache_mb=4096))
    if engine.compiler is not None:
        log("waiting for the compiled decode step ...")
        engine.wait_compiled()
    gpu = dev.type == "cuda"
    log(f"decode path: {engine.compile_status}")
    shots = [ui_screenshot(i, *screen) for i in range(2)]

    chain = engine.decode_steps

    def turns() -> None:
        engine.speculative = False
        engine.open_session([shots[0]]).complete(QUESTION, options=GenerationOptions(max_new_tokens=1))
        fixed = GenerationOptions(max_new_tokens=tokens, min_new_tokens=tokens)
        engine.decode_steps = 1  # "decode": one step per replay
        engine.open_session([shots[0]]).complete(QUESTION, options=fixed)  # features cached: no tower
        engine.decode_steps = chain  # "chain": `chain` steps per replay, one sync each
        engine.open_session([shots[0]]).complete(QUESTION, options=fixed)
        engine.speculative = True
        agent = engine.open_session([shots[1]])
        agent.complete(QUESTION, options=_forced(engine, TOOL_CALLS[0]))

    turns()  # warm-up: every shape seen once before the measured pass
    engine.features.clear()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with _marked(engine), profile(activities=activities) as prof:
        turns()
        if gpu:
            torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    phases = phase_stats(trace, gpu)

    engine.speculative = False
    session = engine.open_session([shots[0]])
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    session.complete(QUESTION, options=GenerationOptions(max_new_tokens=tokens, min_new_tokens=tokens))
    profiler.disable()
    wall = time.perf_counter() - t0
    host = host_per_token(pstats.Stats(profiler), tokens)
    host["whole turn (prompt included)"] = wall * 1000 / tokens
    engine.close()
    return {
        "device": torch.cuda.get_device_name(dev) if gpu else "cpu",
        "decode_path": engine.compile_status,
        "torch": torch.__version__,
        "tokens": tokens,
        "screen": f"{screen[0]}x{screen[1]}",
        "phases": phases,
        "host_ms_per_token": host,
    }


def format_report(report: dict) -> str:
    lines = [
        f"profile on {report['device']} (torch {report['torch']}, decode path: {report['decode_path']}, "
        f"{report['screen']} screenshots)",
        "",
        f"{'phase':<8} {'steps':>5} {'wall ms/step':>13} {'kernel ms':>10} {'gap ms':>8} {'kernels':>8}",
    ]
    for phase, p in report["phases"].items():
        gap = "-" if p["gap_ms_per_step"] is None else f"{p['gap_ms_per_step']:.3f}"
        lines.append(
            f"{phase:<8} {p['steps']:>5} {p['wall_ms_per_step']:>13.3f} {p['kernel_ms_per_step']:>10.3f}"
            f" {gap:>8} {p['kernels_per_step']:>8.0f}"
        )
    for phase, p in report["phases"].items():
        lines += ["", f"top kernels, {phase} (ms per step):"]
        lines += [f"  {k['ms_per_step']:8.3f}  x{k['calls']:<5} {k['name']}" for k in p["top"]]
    lines += ["", f"host time per decoded token ({report['tokens']} tokens, cProfile, callees included):"]
    lines += [f"  {ms:8.3f} ms  {label}" for label, ms in report["host_ms_per_token"].items()]
    return "\n".join(lines)
