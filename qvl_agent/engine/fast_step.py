"""A hand-written decode step for Qwen3-VL's language model: transformers' arithmetic for one token over
the static KV slot, in fewer and fuller kernels.

Why not `torch.compile(model.forward)`: under compile transformers copies every layer's K/V to repeat
them for the query heads (`repeat_kv`, ~0.6 ms a token on an H200 at a 2k view), and runs q/k/v and
gate/up as five small GEMVs per layer that reach a third of the memory bandwidth. Here:

- q/k/v and gate/up each run as one GEMV over weights concatenated once (`fuse_weights`); the model's own
  Linear layers become row views of those tensors, so no memory is added and every other path (prefill,
  vision, the eager forward) reads the very same numbers;
- attention reads each key/value head once for all the query heads of its group, without copying K/V:
  by default through SDPA's `enable_gqa` (`attention="gqa"`: 15 us a layer at a 3k view on an H200,
  against 71 us for packed rows and 51 us for transformers' copy + attention), or with the query heads
  of a group as the rows of one query (`attention="packed"`, the first variant through the GPU check).
  Both give transformers' logits in fp32 on a CPU (tests/test_decode_chain.py) and go through
  `scripts/gpu_check.py` on a GPU;
- the KV write is transformers' own `index_copy_` at the slot's length, and the length counters of all
  layers advance once at the end of the step;
- the element-wise work between the GEMVs (RMSNorms, q/k-norm, RoPE, SiLU, residual adds) is in two
  functions per layer that `compile` may fuse; they do not depend on the KV view's length, so one
  compilation serves every view.

`supported(model)` says when the step applies; otherwise the engine compiles transformers' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def supported(model) -> str:
    """An empty string when `FastStep` computes exactly this model's decoder layers, else why not."""
    text = model.config.get_text_config()
    lm = getattr(getattr(model, "model", None), "language_model", None)
    if lm is None or not hasattr(lm, "rotary_emb"):
        return "not a Qwen3-VL language model"
    if getattr(text, "hidden_act", "") != "silu":
        return f"activation {getattr(text, 'hidden_act', '?')}"
    if getattr(text, "attention_bias", False):
        return "attention with bias"
    layer = lm.layers[0]
    if any(getattr(m, "bias", None) is not None for m in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)):
        return "MLP with bias"
    if text.num_attention_heads % text.num_key_value_heads:
        return "query heads not a multiple of key/value heads"
    return ""


@dataclass
class LayerWeights:
    ln1: torch.Tensor
    qkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def _share(linears, fused: torch.Tensor) -> None:
    """Make each Linear's weight a row view of `fused` (same values, no second copy)."""
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(fused[row : row + n], requires_grad=False)
        row += n


@torch.no_grad()
def fuse_weights(model) -> list[LayerWeights]:
    """Concatenate each layer's q/k/v and gate/up weights (the model's Linears then view them), and
    return every layer's weights as plain tensors for `FastStep`. Call before capturing any graph: it
    replaces the weight tensors that graphs would read."""
    out = []
    for layer in model.model.language_model.layers:
        a, m = layer.self_attn, layer.mlp
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous()
        _share((a.q_proj, a.k_proj, a.v_proj), qkv)
        gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous()
        _share((m.gate_proj, m.up_proj), gate_up)
        out.append(
            LayerWeights(
                ln1=layer.input_layernorm.weight.detach(),
                qkv=qkv,
                q_norm=a.q_norm.weight.detach(),
                k_norm=a.k_norm.weight.detach(),
                o=a.o_proj.weight.detach(),
                ln2=layer.post_attention_layernorm.weight.detach(),
                gate_up=gate_up,
                down=m.down_proj.weight.detach(),
            )
        )
    return out


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3VLTextRMSNorm: in fp32, back to the input dtype, then the weight."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


ATTENTION = ("gqa", "packed")  # how a decode step attends (see the module docstring)


class Aranges:
    """`torch.arange(n)` on a device, made once per (n, device): a step captured in a graph reads the same
    tensor at every replay, and a step run eagerly does not build it again."""

    def __init__(self):
        self._made: dict[tuple, torch.Tensor] = {}

    def __call__(self, n: int, device) -> torch.Tensor:
        key = (n, str(device))
        if key not in self._made:
            self._made[key] = torch.arange(n, device=device)
        return self._made[key]


@dataclass
class Pieces:
    """A step's element-wise work between its matrix products, for `n` rows of `t` tokens each (`h`:
    `[n, t, hidden]`): the single stream's step (n = t = 1), the batched step (`batch_step.py`, t = 1)
    and the prefill and verify passes (`fast_prefill.py`, n = 1) run the very same functions, so what
    passes the check for one passes it for the others.

    attn_in(h, ln1, qkv, q_norm, k_norm, cos, sin) -> q, k, v   (k, v: `[n, kv_heads, t, hd]`; q:
        `[n, heads, t, hd]` with "gqa", the query heads of a group as the rows of one query,
        `[n, kv_heads, groups * t, hd]` (head after head), with "packed")
    attn_out_mlp(h, o, o_w, ln2, gate_up, down) -> h           (o: attention's output)
    final(h, norm, head) -> logits `[n, t, V]`
    """

    attn_in: Callable
    attn_out_mlp: Callable
    final: Callable


def pieces(text, attention: str = "gqa", compile: Callable = lambda f: f) -> Pieces:
    """The step's pieces for the text config `text`; `compile` wraps each (identity by default)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention is one of {', '.join(ATTENTION)}, not {attention!r}")
    hd = text.head_dim
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    nq, nk, eps, inter = heads * hd, kv_heads * hd, text.rms_norm_eps, text.intermediate_size
    groups = heads // kv_heads
    gqa = attention == "gqa"

    def attn_in(h, ln1, qkv_w, qn, kn, cos, sin):
        n, t = h.shape[0], h.shape[1]
        x = _rms(h, ln1, eps)
        q, k, v = F.linear(x, qkv_w).split([nq, nk, nk], dim=-1)
        q = _rms(q.view(n, t, heads, hd), qn, eps).transpose(1, 2)
        k = _rms(k.view(n, t, kv_heads, hd), kn, eps).transpose(1, 2)
        v = v.view(n, t, kv_heads, hd).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if gqa:
            return q, k, v  # [n, heads, t, hd]: SDPA maps query head i to K/V head i // groups
        # The query heads of one group become the rows of one query on their K/V head, head after head.
        return q.reshape(n, kv_heads, groups * t, hd), k, v

    def attn_out_mlp(h, o, o_w, ln2, gu_w, down_w):
        n, t = h.shape[0], h.shape[1]
        if gqa:
            o = o.transpose(1, 2)  # [n, t, heads, hd]
        else:  # [n, kv_heads, groups * t, hd] back to [n, t, heads, hd]
            o = o.reshape(n, kv_heads, groups, t, hd).permute(0, 3, 1, 2, 4)
        h = h + F.linear(o.reshape(n, t, nq), o_w)
        gate, up = F.linear(_rms(h, ln2, eps), gu_w).split([inter, inter], dim=-1)
        return h + F.linear(F.silu(gate) * up, down_w)

    def final(h, norm_w, head_w):
        return F.linear(_rms(h, norm_w, eps), head_w)

    return Pieces(compile(attn_in), compile(attn_out_mlp), compile(final))


class FastStep:
    """`step(ids [1, 1], pos [3, 1, 1], cache)` -> logits `[1, 1, V]`, appending one token to a StaticCache
    (a `KVSlot` view). `compile` wraps the element-wise pieces (identity by default, e.g. on a CPU)."""

    def __init__(self, model, layers: list[LayerWeights], compile: Callable = lambda f: f, attention: str = "gqa"):
        p = pieces(model.config.get_text_config(), attention, compile)
        self.lm = model.model.language_model
        self.norm = self.lm.norm.weight.detach()
        self.head = model.lm_head.weight.detach()
        self.layers = layers
        self.scale = self.lm.layers[0].self_attn.scaling
        self.gqa = attention == "gqa"
        self._range = Aranges()
        self._attn_in, self._attn_out_mlp, self._final = p.attn_in, p.attn_out_mlp, p.final

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        h = self.lm.embed_tokens(ids)
        cos, sin = self.lm.rotary_emb(h, pos)
        layers = cache.layers
        at = layers[0].cumulative_length  # the new token's slot position (every layer's counter agrees)
        span = layers[0].keys.shape[2]
        # Attend to every position up to and including the new token (transformers' causal mask).
        mask = (self._range(span, h.device) <= at).view(1, 1, 1, span)
        index = at.view(1)
        for kv, w in zip(layers, self.layers, strict=True):
            q, k, v = self._attn_in(h, w.ln1, w.qkv, w.q_norm, w.k_norm, cos, sin)
            kv.keys.index_copy_(2, index, k)
            kv.values.index_copy_(2, index, v)
            # o: [1, heads, 1, hd] or [1, kv_heads, groups, hd], both heads in order once flattened
            o = F.scaled_dot_product_attention(
                q, kv.keys, kv.values, attn_mask=mask, scale=self.scale, enable_gqa=self.gqa
            )
            h = self._attn_out_mlp(h, o, w.o, w.ln2, w.gate_up, w.down)
        torch._foreach_add_([kv.cumulative_length for kv in layers], 1)
        return self._final(h, self.norm, self.head)
