"""A quick GPU probe of the prefill pass (`engine/fast_prefill.py`) for a call too short for the whole
check (`scripts/gpu_check.py`): random weights in the real 2B shape, a 1,000-token prefix, DeepStack
features on 500 of the new tokens.

- fp32: the compiled `FastPrefill` against `text_forward` (transformers' layers) over 16 and 2,048 new
  tokens: the largest logit difference, how many greedy choices agree (and how many that differ are
  near-ties), the largest difference of the last layer's keys;
- bf16: milliseconds per pass as a CUDA graph at 16, 64 and 2,048 tokens, for `text_forward` (what the
  prefill buckets replay), `FastPrefill` with eager pieces, and with compiled pieces.

    python scripts/prefill_probe.py
"""

from __future__ import annotations

import time
from functools import partial

import torch
from transformers import Qwen3VLForConditionalGeneration

from qvl_agent.devtools import tiny_model as mf
from qvl_agent.engine.compiled_decode import _compiled_prefill
from qvl_agent.engine.cuda_graphs import KVSlot, text_forward
from qvl_agent.engine.fast_prefill import FastPrefill
from qvl_agent.engine.fast_step import fuse_weights

PREFIX = 1000


def model_of(dtype: torch.dtype, dev: torch.device):
    config = mf.qwen3vl_2b_config(mf.build_processor().tokenizer)
    config.text_config.dtype = config.vision_config.dtype = config.dtype = str(dtype).removeprefix("torch.")
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3VLForConditionalGeneration(config).to(dtype).eval()
    return model, fuse_weights(model)


def inputs(model, t: int, dev: torch.device, dtype: torch.dtype):
    """Embeddings and positions of PREFIX + t tokens, and DeepStack levels with features on 500 of the new ones."""
    hidden = model.config.text_config.hidden_size
    gen = torch.Generator(device=dev).manual_seed(1)
    embeds = torch.randn(1, PREFIX + t, hidden, device=dev, dtype=dtype, generator=gen)
    pos = torch.arange(PREFIX + t, device=dev).view(1, 1, -1).expand(3, 1, -1).contiguous()
    deep = [torch.zeros_like(embeds) for _ in model.config.vision_config.deepstack_visual_indexes]
    n = min(t, 500)
    deep[0][:, PREFIX : PREFIX + n] = torch.randn(1, n, hidden, device=dev, dtype=dtype, generator=gen)
    return embeds, pos, deep


def prefilled(run, model, t: int, dev: torch.device, dtype: torch.dtype):
    """A slot holding the prefix, and a function that runs the t new tokens on it (again and again)."""
    embeds, pos, deep = inputs(model, t, dev, dtype)
    slot = KVSlot(model, 4096, dev, dtype)
    view = slot.views[4096]
    run(embeds[:, :PREFIX], pos[:, :, :PREFIX], view, [d[:, :PREFIX] for d in deep])
    tail = (embeds[:, PREFIX:].contiguous(), pos[:, :, PREFIX:].contiguous(), view, [d[:, PREFIX:] for d in deep])

    def once():
        slot.set_length(PREFIX)
        return run(*tail)

    return slot, once


def graph_ms(fn, reps: int = 10) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def main() -> None:
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(torch.cuda.get_device_name(dev), torch.__version__, flush=True)

    model, layers = model_of(torch.float32, dev)
    compiled = _compiled_prefill(model, layers, "default")
    for t in (16, 2048):
        results = []
        for run in (partial(text_forward, model), compiled):
            slot, once = prefilled(run, model, t, dev, torch.float32)
            logits = model.lm_head(once()[0]).float()
            results.append((logits, slot.cache.layers[-1].keys[:, :, : PREFIX + t].clone()))
        (ref, ref_k), (got, got_k) = results
        top = ref.topk(2, dim=-1).values
        agree = ref.argmax(-1) == got.argmax(-1)
        near = int(((~agree) & (top[:, 0] - top[:, 1] < 1e-3)).sum())
        print(
            f"fp32, {t} tokens after {PREFIX}: compiled FastPrefill against text_forward: largest logit difference "
            f"{(ref - got).abs().max().item():.3g} (logits up to {ref.abs().max().item():.3g}), greedy choices agree "
            f"{int(agree.sum())}/{t} ({near} of the others near-ties), last layer's keys differ by "
            f"{(ref_k - got_k).abs().max().item():.3g}",
            flush=True,
        )
    del model, layers, compiled

    model, layers = model_of(torch.bfloat16, dev)
    t0 = time.perf_counter()
    compiled = _compiled_prefill(model, layers, "default")
    print(f"bf16 prefill pieces compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    runs = {
        "text_forward": partial(text_forward, model),
        "FastPrefill, eager pieces": FastPrefill(model, layers),
        "FastPrefill, compiled pieces": compiled,
    }
    for t in (16, 64, 2048):
        timings = ", ".join(
            f"{name} {graph_ms(prefilled(run, model, t, dev, torch.bfloat16)[1]):.2f} ms" for name, run in runs.items()
        )
        print(f"bf16, {t} tokens after {PREFIX}, one CUDA graph each: {timings}", flush=True)


if __name__ == "__main__":
    main()
