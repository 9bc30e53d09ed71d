"""Random Qwen3-VL models for the engine's CPU checks of its fast paths."""

from __future__ import annotations

import torch


def two_b_widths(tiny_model_dir):
    """Random weights with the real 2B's attention and MLP widths (hidden 2048, 16 query heads on 8 K/V
    heads of 128, MLP 6144) but two layers, one vision block and a small vocabulary: what the fast
    paths' kernels see, on a CPU."""
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    from qvl_agent.devtools.tiny_model import qwen3vl_2b_config

    config = qwen3vl_2b_config(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    text = config.text_config
    text.num_hidden_layers, text.vocab_size, text.dtype = 2, 1024, "float32"
    config.vision_config.depth, config.vision_config.deepstack_visual_indexes = 1, [0]
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
