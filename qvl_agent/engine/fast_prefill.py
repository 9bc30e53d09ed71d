"""Prompt prefill and the verify pass of speculation through the decode step's fused pieces.

The captured prefill buckets (`cuda_graphs.GraphRunner`) replay transformers' eager kernels: a follow-up
of a few dozen tokens costs ~10 ms where a decode step costs ~2.6 ms, and the 16-token verify pass of a
speculative reply ~7.5 ms of kernels. `FastPrefill` runs the same arithmetic as `cuda_graphs.text_forward`
for `t` tokens of one conversation with the fused weights and the element-wise pieces of
`fast_step.pieces`, which `torch.compile` fuses once for every length (the tokens dimension is dynamic),
so the background build compiles it once and captures it again for every bucket (`compiled_decode.py`).

Per layer: the new tokens' K/V are written at the slot's length (transformers' `index_copy_`), and every
token attends to the slot's positions up to its own (transformers' causal mask over a static cache).
Each K/V head is read once for its query heads without copying it: the query heads of a group are the
rows of one query (`attention="packed"`, the mask repeated per head). Not SDPA's `enable_gqa`, which the
decode step uses: with a mask, it has no fused kernel on a GPU and falls back to one that holds every
score of a long prompt in memory; equal head counts take the memory-efficient kernel, in bf16 and in
fp32 alike. DeepStack features arrive as dense `[1, t, hidden]` tensors (zero away from image tokens)
and are added after the first layers, as in `text_forward`. The checks: tests/test_fast_prefill.py on a
CPU in fp32 against one full transformers forward, `scripts/gpu_check.py` on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from qvl_agent.engine.fast_step import Aranges, LayerWeights, pieces


class FastPrefill:
    """`prefill(embeds [1, t, H], pos [3, 1, t], cache, deepstack)` -> the final hidden states `[1, t, H]`
    (after the model's norm, as `text_forward` returns them), appending `t` positions to a StaticCache (a
    `KVSlot` view); `deepstack` lists one `[1, t, H]` tensor per DeepStack level. `compile` wraps the
    element-wise pieces (identity by default, e.g. on a CPU)."""

    def __init__(self, model, layers: list[LayerWeights], compile: Callable = lambda f: f):
        self.lm = model.model.language_model
        text = self.lm.config
        self.pieces = pieces(text, "packed", compile)  # `final` unused: the caller picks the positions
        self.groups = text.num_attention_heads // text.num_key_value_heads
        self.layers = layers
        self.scale = self.lm.layers[0].self_attn.scaling
        self._range = Aranges()

    def __call__(self, embeds: torch.Tensor, pos: torch.Tensor, cache, deepstack: list[torch.Tensor]) -> torch.Tensor:
        t = embeds.shape[1]
        cos, sin = self.lm.rotary_emb(embeds, pos)
        layers = cache.layers
        span = layers[0].keys.shape[2]
        # The new tokens' slot positions (every layer's counter agrees); token i sees keys 0..at+i.
        index = layers[0].cumulative_length + self._range(t, embeds.device)
        allowed = self._range(span, embeds.device).view(1, span) <= index.view(t, 1)
        allowed = allowed.repeat(self.groups, 1).view(1, 1, self.groups * t, span)  # a row per query head and token
        # As an additive mask once, rather than a boolean one that attention converts again in every layer.
        mask = torch.zeros_like(allowed, dtype=embeds.dtype).masked_fill_(~allowed, float("-inf"))
        h = embeds
        for i, (kv, w) in enumerate(zip(layers, self.layers, strict=True)):
            q, k, v = self.pieces.attn_in(h, w.ln1, w.qkv, w.q_norm, w.k_norm, cos, sin)
            kv.keys.index_copy_(2, index, k)
            kv.values.index_copy_(2, index, v)
            o = F.scaled_dot_product_attention(q, kv.keys, kv.values, attn_mask=mask, scale=self.scale)
            h = self.pieces.attn_out_mlp(h, o, w.o, w.ln2, w.gate_up, w.down)
            if i < len(deepstack):
                h = h + deepstack[i]
        torch._foreach_add_([kv.cumulative_length for kv in layers], t)
        return self.lm.norm(h)
