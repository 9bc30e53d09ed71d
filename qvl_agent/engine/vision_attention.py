"""Which fused attention kernel the vision tower runs on this GPU, measured once at start.

A screenshot's patches all attend to each other (8,160 of them at 1080p, 32,400 at 4K), so the vision
tower's time is mostly attention: at 4K about 100 TFLOP of it, ~290 ms with the kernel PyTorch picks
first (flash). PyTorch ranks its fused kernels the same way on every GPU; which one is fastest at these
lengths depends on the GPU, the dtype and the build (cuDNN's is often faster on Hopper in bf16). So
`measure` times each fused kernel on the tower's own head shape at a 4K screenshot's length, keeps
those whose output agrees with the memory-efficient kernel's (a kernel that is fast and wrong is never
used), and the engine runs the tower with them in that order (`VisionAttention.scope`), the math
kernel last for shapes no fused one takes.

`sdpa_kernel` sets process-wide flags: the tower runs under the engine's lock, as every other model
call does, and the one thread that runs beside it (the background compile) calls attention only on
dummy inputs while preparing.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REFERENCE = SDPBackend.EFFICIENT_ATTENTION  # takes every dtype, so it judges the others
CANDIDATES = (REFERENCE, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION)
TOKENS_4K = 32_768  # a 3840x2160 screenshot's patches (32,400), rounded up


@dataclass
class VisionAttention:
    order: list = field(default_factory=list)  # fused kernels, fastest first; empty: PyTorch's own order
    ms: dict[str, float] = field(default_factory=dict)  # per kernel, one attention at TOKENS_4K
    refused: dict[str, str] = field(default_factory=dict)  # kernels left out, and why

    def scope(self):
        """A context in which attention prefers the measured order (nothing changes without one)."""
        if not self.order:
            return contextlib.nullcontext()
        return sdpa_kernel([*self.order, SDPBackend.MATH], set_priority=True)

    def describe(self) -> str:
        timed = ", ".join(f"{name} {ms:.1f} ms" for name, ms in sorted(self.ms.items(), key=lambda kv: kv[1]))
        left = "".join(f"; {name}: {why}" for name, why in self.refused.items())
        return f"vision attention at {TOKENS_4K} tokens: {timed or 'not measured'}{left}"


def measure(heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, reps: int = 3) -> VisionAttention:
    """Time every fused kernel for one image's self-attention at a 4K screenshot's length (on a GPU;
    elsewhere nothing is measured and attention keeps PyTorch's order)."""
    result = VisionAttention()
    if device.type != "cuda":
        return result
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, TOKENS_4K, head_dim, device=device, dtype=dtype, generator=gen) for _ in range(3))
    reference = None
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    for backend in CANDIDATES:
        name = backend.name.lower()
        try:
            with sdpa_kernel([backend]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a kernel that refuses says why in the error too
                out = F.scaled_dot_product_attention(q, k, v)  # also builds what the kernel needs (cuDNN's plan)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    F.scaled_dot_product_attention(q, k, v)
                end.record()
                end.synchronize()
        except RuntimeError as exc:  # not built for this GPU, dtype or head size
            result.refused[name] = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            continue
        if reference is None:
            reference = out
        elif not torch.allclose(out.float(), reference.float(), atol=tolerance, rtol=tolerance):
            gap = (out.float() - reference.float()).abs().max().item()
            result.refused[name] = f"differs from {REFERENCE.name.lower()} by {gap:.3g}"
            continue
        result.ms[name] = start.elapsed_time(end) / reps
    result.order = [b for b in CANDIDATES if b.name.lower() in result.ms]
    result.order.sort(key=lambda b: result.ms[b.name.lower()])
    return result
