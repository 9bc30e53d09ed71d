#!/usr/bin/env python3
"""GPU correctness check of the resident engine: fp32, every fast path on, teacher-forced.

Each scenario runs turns through the engine exactly as the product does (CUDA graphs, KV slot, prefill
buckets, speculative decoding), then runs ONE full transformers forward (no cache, the reference
processor's pixel_values) over the conversation's ids. Wherever the reference's top-2 margin exceeds
1e-3, its argmax at each generated position must equal the engine's token. Random weights in the real
2B shape by default (`--model DIR` loads real ones). Exits 1 on any mismatch or error, 0 otherwise, and
prints a summary (and `--json FILE`).

usage: python scripts/gpu_check.py [--device cuda|cpu] [--model DIR] [--json FILE] [--only concurrent] [--no-compile]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from qvl_agent.config import Settings  # noqa: E402
from qvl_agent.devtools.bench import ui_screenshot  # noqa: E402
from qvl_agent.engine.base import GenerationOptions  # noqa: E402
from qvl_agent.engine.cuda_graphs import GraphRunner  # noqa: E402
from qvl_agent.engine.qwen3vl import Qwen3VLEngine  # noqa: E402
from qvl_agent.errors import GenerationCancelled  # noqa: E402

MARGIN = 1e-3
TOOL_CALL = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [512, 300]}}\n'


def fixed(n: int, **kw) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=n, min_new_tokens=n, **kw)


def build_engine(device: str, model_dir: str | None, compile: bool = True) -> Qwen3VLEngine:
    from transformers import AutoProcessor, GenerationConfig, Qwen3VLForConditionalGeneration

    from qvl_agent.devtools import tiny_model as mf

    dev = torch.device(device)
    if model_dir:
        processor = AutoProcessor.from_pretrained(model_dir)
        model = Qwen3VLForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).to(dev)
    else:
        processor = mf.build_processor()
        config = (mf.qwen3vl_2b_config if dev.type == "cuda" else mf.tiny_config)(processor.tokenizer)
        config.text_config.dtype = config.vision_config.dtype = config.dtype = "float32"
        torch.manual_seed(0)
        with torch.device(dev):
            model = Qwen3VLForConditionalGeneration(config).float()
        ids = mf._token_ids(processor.tokenizer)
        model.generation_config = GenerationConfig(eos_token_id=ids["eos"], pad_token_id=ids["pad"], do_sample=False)
    settings = Settings(feature_cache_mb=8192, compile=compile, fast_batch=True, fast_prefill=True)  # every new path on
    engine = Qwen3VLEngine(model.eval(), processor, name="gpu-check", settings=settings)
    engine.warm_up()
    return engine


class Checker:
    def __init__(self, engine: Qwen3VLEngine):
        self.engine = engine
        self.rows: list[dict] = []

    @torch.inference_mode()
    def turn(self, scenario: str, session, text: str, images=(), options=None, forced: int = 0) -> dict:
        """Run one turn and compare its tokens (after the first `forced`) with the reference."""
        options = options or fixed(16)
        reply = session.complete(text, images, options)
        return self.verify(scenario, session, options, forced, reply)

    @torch.inference_mode()
    def verify(self, scenario: str, session, options, forced: int = 0, reply: str = "") -> dict:
        e = self.engine
        stats = session.last_stats
        ids = session.context.ids
        p = stats.prompt_tokens
        gen = ids[p:]
        shots = [s for t in session.turns for s in t.images]
        k = len(gen)
        row = dict(scenario=scenario, prompt=p, cached=stats.cached_tokens, compared=0, mismatches=0, near_ties=0)
        row["draft_accepted"] = stats.draft_accepted
        if k == 0:
            self.rows.append(row)
            return row
        e.model.model.rope_deltas = None
        input_ids = torch.tensor([ids[: p + k - 1]], device=e.device)
        kwargs = {}
        if shots:
            ref = e.processor.image_processor(images=[s.to_pil() for s in shots], return_tensors="pt")
            kwargs = dict(
                pixel_values=ref["pixel_values"].to(e.device, e.dtype),
                image_grid_thw=ref["image_grid_thw"].to(e.device),
                mm_token_type_ids=(input_ids == e.image_token_id).int(),
            )
        logits = e.model(input_ids=input_ids, logits_to_keep=k, **kwargs).logits[0].float()  # [k, V]
        logits[:, e.banned_ids] = float("-inf")
        logits[: options.min_new_tokens, e.eos_list] = float("-inf")
        top = logits.topk(2, dim=-1)
        for j in range(forced, k):
            choice = int(top.indices[j, 0])
            margin = float(top.values[j, 0] - top.values[j, 1])
            row["compared"] += 1
            if choice != gen[j]:
                if margin > MARGIN:
                    row["mismatches"] += 1
                    row.setdefault("first_mismatch", j)
                else:
                    row["near_ties"] += 1
        e.model.model.rope_deltas = None
        row["tokens"] = gen
        self.rows.append(row)
        return row


def prompt_of(session, n: int) -> str | None:
    """A question whose whole prompt is exactly `n` tokens, None when the template alone is longer."""

    def size(text: str) -> int:
        return len(session._target(text, ())[0].ids)

    base = size("")
    for word in ("a", "x", "the", "1", "ok"):
        one = size(word)
        if size(f"{word} {word}") - one == 1 and size(f"{word} {word} {word}") - one == 2:
            if n < one:
                return None
            text = " ".join([word] * (n - one + 1))
            if size(text) == n:
                return text
    return None if n <= base else ""


def run(engine: Qwen3VLEngine, log, only: str = "") -> Checker:
    c = Checker(engine)
    fast = engine.fast
    seed = [100]  # both decoding variants see the same screens

    def screen(w=1920, h=1080):
        seed[0] += 1
        return ui_screenshot(seed[0], w, h)

    def scenario(name, fn):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:
            c.rows.append(dict(scenario=name, error=f"{type(exc).__name__}: {exc}", compared=0, mismatches=1))
            traceback.print_exc()
        log(f"{name}: {time.perf_counter() - t0:.1f} s")

    def fresh_and_follow_up(tag):
        s = engine.open_session([screen()])
        c.turn(f"fresh{tag}", s, "What is on this screen?", options=fixed(24))
        c.turn(f"follow-up{tag}", s, "And what is the window's title?", options=fixed(24))
        s.close()

    def agent(tag):
        s = engine.open_session(system="You operate a computer.")
        for i in range(3):
            c.turn(f"agent step {i + 1}{tag}", s, f"Step {i + 1}: click the next button.", [screen()], fixed(16))
        s.close()

    def tool_call(tag):
        # A forced tool-call reply (random weights never write one), then free greedy tokens: every
        # position after the forced ones checks the KV that accepted drafts left behind.
        s = engine.open_session([screen()])
        c.turn(f"tool call warm{tag}", s, "Click Save.", options=fixed(8))
        force = tuple(engine.tokenizer.encode(TOOL_CALL, add_special_tokens=False))
        c.turn(
            f"tool call{tag}",
            s,
            "Click Save again.",
            options=fixed(len(force) + 16, force_ids=force),
            forced=len(force),
        )
        s.close()

    def interleaved():
        a, b = engine.open_session([screen()]), engine.open_session([screen(1366, 768)])
        c.turn("interleaved A1", a, "What colour?")
        c.turn("interleaved B1", b, "What shape?")
        c.turn("interleaved A2", a, "Sure?")
        c.turn("interleaved B2", b, "Really?")
        a.close(), b.close()

    def dropped():
        a = engine.open_session([screen()])
        c.turn("dropped: first", a, "First?")
        settings = engine.settings
        engine.settings = dataclasses.replace(settings, session_memory_mb=0)
        try:
            other = engine.open_session([screen()])
            other.complete("Other?", options=fixed(4))
        finally:
            engine.settings = settings
        if a.kv_bytes() != 0:
            raise AssertionError("the memory cap did not drop the idle session's KV")
        row = c.turn("dropped: again", a, "Again?")
        if row["cached"] != 0:
            raise AssertionError("a dropped KV was reused")
        a.close(), other.close()

    def cancelled():
        s = engine.open_session([screen()])
        c.turn("before cancel", s, "What is this?")
        opts = fixed(3000)
        timer = threading.Timer(0.3, s.cancel)  # well into decoding the follow-up
        timer.start()
        try:
            s.complete("Go on.", options=opts)
            raise AssertionError("the turn was not cancelled")
        except GenerationCancelled:
            pass
        timer.cancel()
        if s.last_stats is None:
            raise AssertionError("cancelled before the first token; the check needs a later cancel")
        if s.last_stats.decode_tokens >= 3000:
            raise AssertionError("the cancel did not stop the turn")
        c.verify("cancelled (partial reply)", s, opts)
        c.turn("after cancel", s, "Next?")
        s.close()

    def buckets():
        sizes = fast.sizes if fast else GraphRunner.PREFILL_SIZES
        edges = sorted({n for size in sizes for n in (size, size + 1)} | {size - 2 for size in (2048, 4096)})
        for n in edges:
            s = engine.open_session()
            text = prompt_of(s, n)
            if text is None:
                log(f"prefill {n} tokens: shorter than the template itself, skipped")
                continue
            if not text:
                raise AssertionError(f"cannot build a prompt of exactly {n} tokens")
            row = c.turn(f"prefill {n} tokens", s, text, options=fixed(8))
            if row["prompt"] != n:
                raise AssertionError(f"prompt of {row['prompt']} tokens, wanted {n}")
            s.close()

    def big_screen():
        s = engine.open_session([screen(3840, 2160)])
        c.turn("4K fresh (above the largest bucket)", s, "What is on this screen?")
        c.turn("4K follow-up", s, "And the title?")
        s.close()

    def concurrent():
        """Turns of several sessions decoding in one batch: staggered arrivals, different lengths, a
        cancel mid-batch and a follow-up that reuses its KV while others decode. Each request's tokens
        must equal the same request run alone, and the reference forward's."""
        batcher = engine.batcher
        if batcher is None:
            raise AssertionError("batching is off (max_batch < 2 or no memory for two rows)")
        sizes = [(1280, 720), (1024, 768), (1920, 1080), (800, 600), (1366, 768), (640, 480)]
        shots = [screen(w, h) for w, h in sizes]
        lengths = [12 + 10 * i for i in range(len(shots))]
        FOLLOW, CANCEL = 0, 3  # request 0 asks a follow-up meanwhile; request 3 is cancelled mid-batch

        def snapshot(session):
            """What `verify` reads of a session, as it is after this turn (a follow-up comes later)."""
            context = types.SimpleNamespace(ids=list(session.context.ids))
            return types.SimpleNamespace(context=context, last_stats=session.last_stats, turns=list(session.turns))

        def conversation(i, session, results, cancel_after=None):
            opts = fixed(lengths[i])
            if cancel_after is not None:
                threading.Timer(cancel_after, session.cancel).start()
            try:
                session.complete(f"Request {i}: what is on this screen?", options=opts)
            except GenerationCancelled:
                results[i] = ("cancelled", snapshot(session))
                return
            results[i] = (list(session.context.ids), snapshot(session))
            if i == FOLLOW:
                session.complete("And the title?", options=fixed(20))
                results["follow"] = (list(session.context.ids), snapshot(session))

        alone: dict = {}
        for i, shot in enumerate(shots):  # one at a time: the single-stream path
            conversation(i, engine.open_session([shot]), alone)
        ties = {}  # a near-tie may round either way in a batched step: then only the reference decides
        for i, (_, session) in enumerate(alone[k] for k in range(len(shots))):
            ties[i] = c.verify(f"concurrent: request {i} alone", session, fixed(lengths[i]))["near_ties"]

        before = sum(batcher.batch_sizes.values())
        ahead, graph_prefills = batcher.ahead_steps, batcher.graph_prefills
        batched: dict = {}
        threads = []
        for i, shot in enumerate(shots):
            cancel_after = 0.5 if i == CANCEL else None
            t = threading.Thread(target=conversation, args=(i, engine.open_session([shot]), batched, cancel_after))
            t.start()
            threads.append(t)
            time.sleep(0.03 * i)  # staggered arrivals: later ones join a batch already decoding
        for t in threads:
            t.join(600)
        if sum(batcher.batch_sizes.values()) == before:
            raise AssertionError("no decode step ran batched")
        if batcher.ahead_steps == ahead:
            raise AssertionError("no batched step ran ahead of the host")
        if engine.fast is not None and batcher.graph_prefills == graph_prefills:
            raise AssertionError("no batched prompt was prefilled through a captured graph")
        for i in range(len(shots)):
            ids, session = batched[i]
            if ids == "cancelled":
                if session.last_stats and session.last_stats.decode_tokens >= lengths[i]:
                    raise AssertionError("the cancel did not stop its turn")
                c.verify(f"concurrent: request {i} cancelled mid-batch (partial)", session, fixed(lengths[i]))
                continue
            row = c.verify(
                f"concurrent: request {i} batched ({session.last_stats.decode_path})", session, fixed(lengths[i])
            )
            if ids != alone[i][0] and not (row["near_ties"] or ties[i]):
                row["mismatches"] += 1
                row["error"] = "batched tokens differ from the same request alone"
        ids, session = batched["follow"]
        row = c.verify("concurrent: follow-up while others decode", session, fixed(20))
        if ids != alone["follow"][0]:
            row["mismatches"] += 1
            row["error"] = "batched follow-up differs from the same follow-up alone"
        if session.last_stats.cached_tokens == 0:
            raise AssertionError("the follow-up did not reuse its KV")
        log(
            f"batch sizes so far: {dict(sorted(batcher.batch_sizes.items()))}; steps run ahead of the host: "
            f"{batcher.ahead_steps}; prompts prefilled as a graph: {batcher.graph_prefills}"
        )

    def prefetched():
        s = engine.open_session()
        s.prefetch([screen()])
        c.turn("prefetched screenshot", s, "What is on this screen?")
        s.close()

    chain = engine.decode_steps
    # Speculative (drafts verified, chains between them), plain (greedy chains of `decode_steps` tokens
    # per replay) and single-step (one token per replay): all three must give the same tokens.
    variants = ((" [speculative]", True, chain), (" [plain]", False, chain), (" [single-step]", False, 1))
    for tag, on, steps in variants if not only else ():
        engine.speculative, engine.decode_steps = on, steps
        seed[0] = 100
        scenario("fresh + follow-up" + tag, lambda t=tag: fresh_and_follow_up(t))
        scenario("agent 3 steps" + tag, lambda t=tag: agent(t))
        scenario("tool call" + tag, lambda t=tag: tool_call(t))
    engine.speculative, engine.decode_steps = True, chain
    if only:
        scenario(only, {"concurrent": concurrent}[only])
        return c
    scenario("interleaved sessions", interleaved)
    scenario("dropped KV", dropped)
    scenario("cancelled stream", cancelled)
    scenario("prefill bucket edges", buckets)
    scenario("screen above the largest bucket", big_screen)
    if hasattr(engine.open_session(), "prefetch"):
        scenario("prefetch", prefetched)
    scenario("concurrent", concurrent)
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=["concurrent"], help="run one scenario only (a quick check)")
    ap.add_argument("--no-compile", action="store_true", help="plain graphs only, no compiled decode step")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    engine = build_engine(args.device, args.model, compile=not args.no_compile)
    log(f"engine ready in {time.perf_counter() - t0:.1f} s; graphs: {bool(engine.fast)} {engine.fast_problem}")
    problems = []
    if engine.compiler is not None:  # check the compiled decode step, not the plain graphs it replaces
        t1 = time.perf_counter()
        if not engine.wait_compiled():
            problems.append(f"compiled decode step: {engine.compile_status}")
        log(f"decode path: {engine.compile_status} after {time.perf_counter() - t1:.1f} s more")
    if args.device.startswith("cuda"):
        if engine.fast is None or not engine.fast.prefill:
            problems.append(f"fast paths off: {engine.fast_problem or 'no prefill graphs'}")
        if engine.step_weights is None:
            problems.append("the hand-written decode step is off")
        if engine.batcher is not None and not engine.batcher.step.graphs:
            problems.append(f"batched decode graphs are off: {engine.batcher.step.problem}")
        if engine.compiler is not None and engine.decode_steps > 1 and not engine.fast.chains:
            problems.append("no chained decode graphs were captured")
        fast = engine.fast
        if engine.compiler is not None and fast is not None and fast.fused_prefill != set(fast.prefill):
            problems.append(f"{len(fast.fused_prefill)} of {len(fast.prefill)} prefill graphs fused")
    checker = run(engine, log, args.only or "")
    rows = checker.rows
    # Speculative and plain decoding must give identical tokens.
    by_name = {r["scenario"]: r.get("tokens") for r in rows}
    for name, tokens in by_name.items():
        if name.endswith("[speculative]") and tokens != by_name.get(name.replace("[speculative]", "[plain]")):
            problems.append(f"{name}: speculative tokens differ from plain greedy")
        if name.endswith("[plain]") and tokens != by_name.get(name.replace("[plain]", "[single-step]")):
            problems.append(f"{name}: chained greedy steps differ from single steps")
    compared = sum(r["compared"] for r in rows)
    mismatches = sum(r["mismatches"] for r in rows)
    summary = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "dtype": str(engine.dtype),
        "cuda_graphs": bool(engine.fast),
        "decode_path": engine.compile_status,
        "decode_step": "fast step" if engine.step_weights is not None else "transformers forward",
        "decode_chain": max([k for k, _ in engine.fast.chains], default=1) if engine.fast else 1,
        "prefill_graphs": len(engine.fast.prefill) if engine.fast else 0,
        "fused_prefill_graphs": len(engine.fast.fused_prefill) if engine.fast else 0,
        "batch_graphs": len(engine.batcher.step.graphs) if engine.batcher else 0,
        "batch_sizes": dict(sorted(engine.batcher.batch_sizes.items())) if engine.batcher else {},
        "scenarios": len(rows),
        "tokens_compared": compared,
        "mismatches": mismatches,
        "near_ties": sum(r.get("near_ties", 0) for r in rows),
        "draft_accepted": sum(r.get("draft_accepted", 0) for r in rows),
        "problems": problems,
        "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
    }
    for r in summary["rows"]:
        flag = "FAIL" if r["mismatches"] or "error" in r else "ok"
        print(
            f"{flag:4} {r['scenario']:42} prompt {r.get('prompt', 0):>6} cached {r.get('cached', 0):>6} "
            f"compared {r['compared']:>3} mismatches {r['mismatches']} near-ties {r.get('near_ties', 0)} "
            f"drafts kept {r.get('draft_accepted', 0)} {r.get('error', '')}"
        )
    print(
        f"SUMMARY {summary['device']} {summary['dtype']} graphs={summary['cuda_graphs']} "
        f"decode={summary['decode_path']} step={summary['decode_step']} chain={summary['decode_chain']} "
        f"({summary['prefill_graphs']} prefill, {summary['fused_prefill_graphs']} of them fused, "
        f"{summary['batch_graphs']} batch): {summary['scenarios']} turns, "
        f"{compared} tokens compared, "
        f"{mismatches} mismatches, {summary['near_ties']} near-ties, {summary['draft_accepted']} drafts kept; "
        f"problems: {problems or 'none'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if mismatches or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
