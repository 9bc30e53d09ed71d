"""Engine benchmark: the resident engine against the plain transformers pipeline, in one process.

The baseline is what a person writes from the model card: PNG decode + the reference processor +
`model.generate`. Both sides run the same model (the real Qwen3-VL-2B shape with random weights, or
real weights from `--model`) on the same 1920x1080 UI-like screenshots, with fixed token counts
(no early stop on random weights). Every figure is a median over `--reps` runs after a warm-up.

Scenarios: (a) fresh screenshot + question -> first token; (b) follow-up on the same screenshot ->
first token; (c) agent step on a changed screenshot with two earlier steps in context -> 30-token
action; (d) plain decode tokens/s over 256 tokens (speculation off); (e) start to ready; (f) a computer-use
tool-call reply in an agent session, in effective tokens/s with speculative decoding (random weights never
write a tool call, so the reply's tokens are forced: every forward and verification runs as it would for
a model that wrote them); (g) a screenshot prefetched while the person types, Enter -> first token. Then
first token on a fresh screenshot by screen size.
"""

from __future__ import annotations

import io
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from qvl_agent.config import from_environment
from qvl_agent.devtools.screens import ui_screenshot
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.preprocess import preprocess
from qvl_agent.engine.qwen3vl import Qwen3VLEngine, pick_device
from qvl_agent.image import Screenshot

QUESTION = "What is on this screen, and where is the Save button?"
FOLLOW_UP = "And what is the window's title?"
_CALL = '<tool_call>\n{"name": "computer_use", "arguments": {"action": '
TOOL_CALLS = (
    _CALL + '"left_click", "coordinate": [412, 87]}}\n</tool_call>',
    _CALL + '"type", "text": "quarterly report"}}\n</tool_call>',
    _CALL + '"left_click", "coordinate": [731, 644]}}\n</tool_call>',
)
SCREENS = ((1366, 768), (1920, 1080), (2560, 1440), (3840, 2160))


def png_bytes(shot: Screenshot) -> bytes:
    buf = io.BytesIO()
    shot.to_pil().save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Result:
    name: str
    engine: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    unit: str = "ms"
    higher_is_better: bool = False

    def row(self) -> dict:
        e = statistics.median(self.engine) if self.engine else float("nan")
        b = statistics.median(self.baseline) if self.baseline else float("nan")
        speedup = (e / b) if self.higher_is_better else (b / e)
        return {
            "scenario": self.name,
            "unit": self.unit,
            "engine": round(e, 2),
            "baseline": round(b, 2),
            "speedup": round(speedup, 2),
            "engine_runs": [round(v, 2) for v in self.engine],
            "baseline_runs": [round(v, 2) for v in self.baseline],
        }


class Baseline:
    """The plain transformers pipeline, as on the model card."""

    def __init__(self, model, processor, device):
        self.model, self.processor, self.device = model, processor, device

    def _inputs(self, turns: list[tuple[bytes | None, str, str | None]]):
        from PIL import Image

        messages, images = [], []
        for png, text, reply in turns:
            content = []
            if png is not None:
                images.append(Image.open(io.BytesIO(png)).convert("RGB"))
                content.append({"type": "image"})
            content.append({"type": "text", "text": text})
            messages.append({"role": "user", "content": content})
            if reply is not None:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
        prompt = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.processor(text=[prompt], images=images or None, return_tensors="pt").to(self.device)

    def preprocess_ms(self, png: bytes) -> float:
        """PNG bytes -> pixel_values on the model's device through the reference processor."""
        from PIL import Image

        _sync(self.device)
        start = time.perf_counter()
        image = Image.open(io.BytesIO(png)).convert("RGB")
        self.processor.image_processor(images=[image], return_tensors="pt")["pixel_values"].to(self.device)
        _sync(self.device)
        return (time.perf_counter() - start) * 1000

    @torch.inference_mode()
    def decode_tokens_per_s(self, turns, new_tokens: int) -> float:
        """Tokens/s after the first token, timed inside one `generate` call. (Subtracting a 1-token run
        from an n-token run instead mixes two runs' noise and can even come out negative.)"""
        from transformers.generation.streamers import BaseStreamer

        device = self.device

        class Stamps(BaseStreamer):
            """Records when each new token reaches the streamer; the first `put` is the prompt."""

            def __init__(self):
                self.times: list[float] = []

            def put(self, value):
                _sync(device)
                self.times.append(time.perf_counter())

            def end(self):
                pass

        stamps = Stamps()
        inputs = self._inputs(turns)
        self.model.model.rope_deltas = None
        self.model.generate(
            **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=stamps
        )
        first, last = stamps.times[1], stamps.times[-1]
        return (new_tokens - 1) / (last - first)

    @torch.inference_mode()
    def generate(self, turns, new_tokens: int) -> tuple[float, torch.Tensor]:
        """Seconds from PNG bytes to `new_tokens` tokens, and the generated ids."""
        start = time.perf_counter()
        inputs = self._inputs(turns)
        self.model.model.rope_deltas = None
        out = self.model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        _sync(self.device)
        return time.perf_counter() - start, out[0, inputs["input_ids"].shape[1] :]


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _first_token_ms(session, text, images=()) -> float:
    """Time to the first token, as the engine measures it: from the start of the turn to the first
    token chosen and on the host. (Random weights mostly pick ids that the small tokenizer cannot turn
    into text, so waiting for the first streamed piece would time the whole turn instead.)"""
    session.complete(text, images, GenerationOptions(max_new_tokens=1, min_new_tokens=1))
    return session.last_stats.ttft_ms


def _timed_preprocess(engine, shot) -> float:
    """Raw BGRA capture -> pixel_values on the engine's device, as the engine does it on a miss."""
    _sync(engine.device)
    start = time.perf_counter()
    preprocess(shot, engine.pp, engine.device)
    _sync(engine.device)
    return (time.perf_counter() - start) * 1000


def _timed(session, text, images, new_tokens) -> float:
    start = time.perf_counter()
    session.complete(text, images, GenerationOptions(max_new_tokens=new_tokens, min_new_tokens=new_tokens))
    return (time.perf_counter() - start) * 1000


def _forced(engine, reply: str) -> GenerationOptions:
    """Options that make the engine write `reply` (then its end token), token by token."""
    ids = tuple(engine.tokenizer.encode(reply, add_special_tokens=False)) + (engine.im_end_id,)
    return GenerationOptions(max_new_tokens=len(ids), min_new_tokens=len(ids) - 1, force_ids=ids)


ZOOM_SCREENS = ((1920, 1080), (3840, 2160))
CLICK = _CALL + '"left_click", "coordinate": [512, 384]}}\n</tool_call>'


def zoom_costs(engine, reps: int, warm_ups: int = 1) -> list[dict]:
    """Milliseconds per click of grounding, one pass and with the zoom-in pass (a crop of half of each side
    around the first point, new vision features), by screen: Qwen3-VL's grounding prompt, each answer forced
    to the same tool call. Medians of `reps` after `warm_ups` runs that set up each size."""
    from qvl_agent.grounding import system_prompt, user_text
    from qvl_agent.image import zoom_region

    rows = []
    for width, height in ZOOM_SCREENS:
        one, zoom = [], []
        for i in range(warm_ups + reps):
            shot = ui_screenshot(2000 + i, width, height)
            crop = shot.crop(zoom_region(512, 384, shot, 0.5))
            took = []
            for image in (shot, crop):
                session = engine.open_session(system=system_prompt())
                start = time.perf_counter()
                session.complete(user_text("the Save button"), [image], _forced(engine, CLICK))
                took.append((time.perf_counter() - start) * 1000)
                session.close()
            if i >= warm_ups:
                one.append(took[0])
                zoom.append(took[1])
        first, second = statistics.median(one), statistics.median(zoom)
        rows.append(
            {
                "screen": f"{width}x{height}",
                "crop": f"{crop.width}x{crop.height}",
                "one_pass_ms": round(first, 2),
                "zoom_pass_ms": round(second, 2),
                "per_click_with_zoom_ms": round(first + second, 2),
            }
        )
    return rows


def results_prompt_overhead(engine) -> int:
    """Prompt tokens of QUESTION without an image (so prompt - this = visual tokens + 2 markers)."""
    session = engine.open_session()
    return len(session._target(QUESTION, ())[0].ids) + 2


def build_model_dir(shape: str, path: Path, device: torch.device) -> Path:
    """Save a random-weight model of `shape`, initialised on the device (fast even for 2B)."""
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    from qvl_agent.devtools import tiny_model as mf

    processor, config = mf.random_model_parts(shape)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config).to(dtype)
    ids = mf._token_ids(processor.tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=ids["eos"], pad_token_id=ids["pad"], do_sample=False)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    del model
    return path


def run(
    model: str | None, device: str, reps: int, log=print, shape: str | None = None, start_times: bool = False
) -> dict:
    """`shape` (random weights when no `model`): a key of tiny_model.SHAPES; default the real 2B shape on a
    GPU, the tiny one on a CPU. `start_times`: first time start to ready in two fresh processes, with the
    compile cache cold and then warm (`ready.start_times`; minutes on a GPU, for the cold compile)."""
    dev = pick_device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tmp = None
    if model is None:
        tmp = tempfile.TemporaryDirectory(prefix="qvl-bench-")
        shape = shape or ("2b" if dev.type == "cuda" else "tiny")
        log(f"building a random Qwen3-VL ({shape} shape) in {tmp.name}")
        model = str(build_model_dir(shape, Path(tmp.name), dev))
    results: dict[str, Result] = {}
    starts = None
    if start_times:  # before this process takes the GPU: each start has it to itself
        from qvl_agent.devtools.ready import start_times as fresh_starts

        starts = dict(zip(("cold", "warm"), fresh_starts(model, str(dev), log), strict=True))

    # (e) start to ready: load + warm-up (CUDA graphs) for the engine, load for the baseline.
    t0 = time.perf_counter()
    engine = Qwen3VLEngine.load(model, device=str(dev), settings=from_environment(feature_cache_mb=4096))
    _sync(dev)
    ready_s = time.perf_counter() - t0
    log(f"engine ready in {ready_s:.1f} s; CUDA graphs: {'on' if engine.fast else 'off ' + engine.fast_problem}")
    t0 = time.perf_counter()
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    base_model = (
        Qwen3VLForConditionalGeneration.from_pretrained(model, dtype=engine.dtype, attn_implementation="sdpa")
        .to(dev)
        .eval()
    )
    base = Baseline(base_model, AutoProcessor.from_pretrained(model), dev)
    _sync(dev)
    results["e"] = Result("(e) start to ready", [ready_s], [time.perf_counter() - t0], unit="s")

    # The compiled decode step builds in the background; the speed rows measure it once it is in.
    t0 = time.perf_counter()
    if engine.compiler is not None:
        log("waiting for the compiled decode step ...")
        engine.wait_compiled()
    compile_wait_s = time.perf_counter() - t0
    log(f"decode path: {engine.compile_status} (waited {compile_wait_s:.1f} s)")
    if engine.compiler is not None:
        log(f"compiled decode step built in {engine.compiler.seconds:.1f} s after ready")
    shots = [ui_screenshot(i) for i in range(8 * reps + 8)]
    pngs = [png_bytes(s) for s in shots]
    nxt = iter(range(len(shots)))

    def fresh():
        i = next(nxt)
        return shots[i], pngs[i]

    # Warm both paths once on their own screenshots.
    s0, p0 = fresh()
    _first_token_ms(engine.open_session([s0]), QUESTION)
    base.generate([(p0, QUESTION, None)], 1)

    p = results["p"] = Result("(p) 1080p screenshot -> pixel_values on the model's device")
    for shot, png in zip(shots[:reps], pngs[:reps], strict=True):
        p.engine.append(_timed_preprocess(engine, shot))
        p.baseline.append(base.preprocess_ms(png))

    a = results["a"] = Result("(a) fresh screenshot -> first token")
    b = results["b"] = Result("(b) follow-up -> first token")
    parts: dict[str, list[float]] = {
        "preprocess_ms": [],
        "vision_ms": [],
        "a_prefill_tokens": [],
        "b_prefill_tokens": [],
    }
    for _ in range(reps):
        shot, png = fresh()
        session = engine.open_session([shot])
        a.engine.append(_first_token_ms(session, QUESTION))
        stats = session.last_stats
        b.engine.append(_first_token_ms(session, FOLLOW_UP))
        if stats:
            parts["preprocess_ms"].append(stats.preprocess_ms)
            parts["vision_ms"].append(stats.vision_ms)
            parts["a_prefill_tokens"].append(stats.prefill_tokens)
        if session.last_stats:
            parts["b_prefill_tokens"].append(session.last_stats.prefill_tokens)
        a.baseline.append(base.generate([(png, QUESTION, None)], 1)[0] * 1000)
        reply = session.turns[0].reply
        b.baseline.append(base.generate([(png, QUESTION, reply), (None, FOLLOW_UP, None)], 1)[0] * 1000)

    c = results["c"] = Result("(c) agent step, changed screen, 2 steps in context -> 30 tokens")
    for _ in range(reps):
        steps = [fresh() for _ in range(3)]
        session = engine.open_session()
        history = []
        for i, (shot, png) in enumerate(steps[:2]):
            text = f"Step {i + 1}: click the next button."
            session.complete(text, [shot], GenerationOptions(max_new_tokens=30, min_new_tokens=30))
            history.append((png, text, session.turns[-1].reply))
        c.engine.append(_timed(session, "Step 3: what next?", [steps[2][0]], 30))
        c.baseline.append(base.generate(history + [(steps[2][1], "Step 3: what next?", None)], 30)[0] * 1000)

    d = results["d"] = Result("(d) decode tokens/s over 256 tokens", unit="tok/s", higher_is_better=True)
    shot, png = fresh()
    engine.speculative = False  # plain decoding: one forward per token
    for _ in range(max(2, reps // 2)):
        session = engine.open_session([shot])
        session.complete(QUESTION, options=GenerationOptions(max_new_tokens=256, min_new_tokens=256))
        d.engine.append(session.last_stats.decode_tokens_per_s)
        d.baseline.append(base.decode_tokens_per_s([(png, QUESTION, None)], 256))
    engine.speculative = engine.settings.speculative

    f = results["f"] = Result(
        "(f) tool-call reply, speculative, effective tokens/s", unit="tok/s", higher_is_better=True
    )
    accepted = []
    for _ in range(reps):
        steps = [fresh() for _ in range(2)]
        session = engine.open_session(system="You operate a computer with the computer_use tool.")
        first = _forced(engine, TOOL_CALLS[0])
        session.complete("Step 1: open the report.", [steps[0][0]], first)
        forced = _forced(engine, TOOL_CALLS[1 + len(f.engine) % 2])
        session.complete("Step 2: what next?", [steps[1][0]], forced)
        f.engine.append(session.last_stats.decode_tokens_per_s)
        accepted.append(session.last_stats.draft_accepted / max(1, session.last_stats.decode_tokens))
        history = [(steps[0][1], "Step 1: open the report.", TOOL_CALLS[0])]
        f.baseline.append(
            base.decode_tokens_per_s(history + [(steps[1][1], "Step 2: what next?", None)], forced.max_new_tokens)
        )
    parts["f_tokens"] = [forced.max_new_tokens]
    parts["f_draft_accepted_share"] = accepted

    g = results["g"] = Result("(g) prefetched screenshot, Enter -> first token")
    for _ in range(reps):
        shot, png = fresh()
        session = engine.open_session()
        session.prefetch([shot])
        g.engine.append(_first_token_ms(session, QUESTION))
        g.baseline.append(base.generate([(png, QUESTION, None)], 1)[0] * 1000)

    # A GPU's first run of a new size sets up its kernels and memory for it: that run is not timed. On a CPU
    # the first run costs what the next does (the grid's inputs take milliseconds), so it is not run twice:
    # there a 4K screenshot's vision tower takes seconds even in the tiny model.
    warm_ups = 1 if dev.type == "cuda" else 0
    screens = []
    for width, height in SCREENS:
        for i in range(warm_ups + 1):
            shot = ui_screenshot(1000 + i, width, height)
            session = engine.open_session([shot])
            ms = _first_token_ms(session, QUESTION)
        stats = session.last_stats
        screens.append(
            {
                "screen": f"{width}x{height}",
                "visual_tokens": stats.prompt_tokens - results_prompt_overhead(engine),
                "first_token_ms": round(ms, 2),
                "vision_ms": round(stats.vision_ms, 2),
            }
        )

    # Correctness: greedy tokens of the fast path against generate on the same prompt.
    shot, png = fresh()
    session = engine.open_session([shot])
    session.complete(QUESTION, options=GenerationOptions(max_new_tokens=32, min_new_tokens=32))
    fast_ids = session.context.ids[session.last_stats.prompt_tokens :]
    _, ref_ids = base.generate([(png, QUESTION, None)], 32)
    ref_ids = ref_ids.tolist()
    logits = []
    hook = engine.model.lm_head.register_forward_hook(
        lambda m, i, o: logits.append(o.reshape(-1, o.shape[-1])[-1].float().clone())
    )
    engine.open_session([shot]).complete(QUESTION, options=GenerationOptions(max_new_tokens=1, min_new_tokens=1))
    hook.remove()
    with torch.inference_mode():
        base.model.model.rope_deltas = None
        ref_logits = base.model(**base._inputs([(png, QUESTION, None)])).logits[0, -1].float()
    logit_diff = (logits[0] - ref_logits).abs().max().item()
    agree = next(
        (i for i, (x, y) in enumerate(zip(fast_ids, ref_ids, strict=False)) if x != y), min(len(fast_ids), len(ref_ids))
    )

    report = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": f"random weights, {'Qwen3-VL-2B' if shape == '2b' else shape} shape" if tmp else model,
        "cuda_graphs": bool(engine.fast),
        "cuda_graphs_problem": engine.fast_problem,
        "decode_path": engine.compile_status,
        "compile_wait_s": round(compile_wait_s, 1),
        "compile_s": round(engine.compiler.seconds, 1) if engine.compiler else None,
        "prefill_graphs": len(engine.fast.prefill) if engine.fast else 0,
        "fused_prefill_graphs": len(engine.fast.fused_prefill) if engine.fast else 0,
        "rows": [r.row() for r in results.values()],
        "start_times": starts,
        "screens": screens,
        "zoom": zoom_costs(engine, reps, warm_ups),
        "greedy_tokens_agreeing_with_generate": f"{agree}/{len(ref_ids)}",
        "first_token_max_abs_logit_diff": round(logit_diff, 5),
        "first_token_logit_scale": round(ref_logits.abs().max().item(), 3),
        "engine_breakdown_medians": {k: round(statistics.median(v), 3) for k, v in parts.items() if v},
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None,
    }
    if tmp:
        tmp.cleanup()
    return report


def format_table(report: dict) -> str:
    lines = [
        f"device: {report['device']}  torch {report['torch']}  model: {report['model']}  "
        f"CUDA graphs: {report['cuda_graphs']} ({report['prefill_graphs']} prefill, "
        f"{report.get('fused_prefill_graphs', 0)} fused) {report['cuda_graphs_problem']}  "
        f"decode path: {report.get('decode_path', '')}",
        f"{'scenario':66} {'engine':>10} {'baseline':>10} {'speedup':>8}",
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['scenario']:66} {r['engine']:>8} {r['unit']:<3}{r['baseline']:>8} {r['unit']:<3}{r['speedup']:>6}x"
        )
    if report.get("start_times"):
        lines.append(start_times_line(report["start_times"]))
    lines.append(
        f"greedy tokens agreeing with generate: {report['greedy_tokens_agreeing_with_generate']}; "
        f"first-token max |logit diff| {report['first_token_max_abs_logit_diff']} "
        f"(logits up to {report['first_token_logit_scale']})"
    )
    lines.append(f"engine breakdown (medians): {report['engine_breakdown_medians']}")
    lines.append(f"{'screen':12} {'visual tokens':>14} {'first token':>12} {'vision tower':>13}")
    for r in report.get("screens", []):
        lines.append(f"{r['screen']:12} {r['visual_tokens']:>14} {r['first_token_ms']:>9} ms {r['vision_ms']:>10} ms")
    lines.append(f"{'grounding per click':20} {'crop':>10} {'one pass':>10} {'zoom pass':>10} {'with zoom':>10}")
    for r in report.get("zoom", []):
        lines.append(
            f"{r['screen']:20} {r['crop']:>10} {r['one_pass_ms']:>7} ms {r['zoom_pass_ms']:>7} ms "
            f"{r['per_click_with_zoom_ms']:>7} ms"
        )
    if report["peak_gpu_memory_gib"] is not None:
        lines.append(f"peak GPU memory: {report['peak_gpu_memory_gib']} GiB")
    return "\n".join(lines)


def start_times_line(starts: dict) -> str:
    """(e) in fresh processes: ready, then the compiled step's build after ready, cold and warm cache."""
    parts = []
    for which in ("cold", "warm"):
        run = starts[which]
        built = f" + compile {run['compile_s']:.1f} s" if run["compile_s"] is not None else " (nothing to compile)"
        parts.append(f"{which} compile cache {run['ready_s']:.1f} s{built}")
    return "(e) start to ready in a fresh process: " + "; ".join(parts)


def main_json(report: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2) + "\n")
