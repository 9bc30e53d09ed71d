"""A quick GPU probe of the prefill pass and the vision tower's kernels, for a call too short for the
whole check: random weights in the real 2B shape, no compile. For fp32 and bf16: `FastPrefill` (eager
pieces) against `text_forward` on the same prompt (largest difference of the final hidden states, and
milliseconds per pass at 32 and 2,048 tokens after a 1,000-token prefix), then the vision attention
timings `fast_prefill` would choose from. Prints one line each.

    python scripts/prefill_probe.py
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import Qwen3VLForConditionalGeneration

from qvl_agent.devtools import tiny_model as mf
from qvl_agent.engine.cuda_graphs import KVSlot, text_forward
from qvl_agent.engine.fast_prefill import FastPrefill
from qvl_agent.engine.fast_step import fuse_weights
from qvl_agent.engine.vision_attention import measure


def timed(fn, reps: int = 5) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def main() -> None:
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    processor = mf.build_processor()
    for dtype in (torch.float32, torch.bfloat16):
        config = mf.qwen3vl_2b_config(processor.tokenizer)
        name = "float32" if dtype == torch.float32 else "bfloat16"
        config.text_config.dtype = config.vision_config.dtype = config.dtype = name
        torch.manual_seed(0)
        with torch.device(dev):
            model = Qwen3VLForConditionalGeneration(config).to(dtype).eval()
        layers = fuse_weights(model)
        prefill = FastPrefill(model, layers)
        hidden = config.text_config.hidden_size
        levels = len(config.vision_config.deepstack_visual_indexes)
        gen = torch.Generator(device=dev).manual_seed(1)
        for prefix, t in ((1000, 32), (1000, 2048)):
            embeds = torch.randn(1, prefix + t, hidden, device=dev, dtype=dtype, generator=gen)
            pos = torch.arange(prefix + t, device=dev).view(1, 1, -1).expand(3, 1, -1)
            deep = [torch.zeros_like(embeds) for _ in range(levels)]
            outs, ms = [], []
            for run in (partial(text_forward, model), prefill):
                slot = KVSlot(model, 4096, dev, dtype)
                run(embeds[:, :prefix], pos[:, :, :prefix], slot.views[4096], [d[:, :prefix] for d in deep])
                tail = (embeds[:, prefix:], pos[:, :, prefix:], slot.views[4096], [d[:, prefix:] for d in deep])

                def once(run=run, slot=slot, tail=tail, prefix=prefix):
                    slot.set_length(prefix)
                    return run(*tail)

                outs.append(once())
                ms.append(timed(once))
            gap = (outs[0].float() - outs[1].float()).abs().max().item()
            print(
                f"{name} prefill {t} tokens after {prefix}: text_forward {ms[0]:.2f} ms, FastPrefill (eager pieces) "
                f"{ms[1]:.2f} ms, largest hidden difference {gap:.3g} (scale {outs[0].abs().max().item():.3g})",
                flush=True,
            )
        vision = config.vision_config
        print(f"{name} {measure(vision.num_heads, vision.hidden_size // vision.num_heads, dtype, dev).describe()}")
        del layers, prefill
        model = None  # its memory goes back before the next dtype's model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
