"""CUDA-graph fast paths for the resident engine on a GPU.

Eager transformers pays 28-45 ms of Python and launch overhead per forward, whatever its length; a
decode step or a short follow-up has almost no arithmetic to hide that behind. So:

- `KVSlot` is one static KV cache on the GPU that graphs are captured against. A turn loads its
  session's KV into the slot (skipped when the slot already holds it) and copies the new KV back to the
  session's own cache at the end, so any session can use the slot next.
- `GraphRunner` captures transformers' own forward over the slot for a few input lengths: 1 (a decode
  step) and buckets for short prefills (a follow-up question). Inputs are padded to the bucket; padding
  only writes KV past the real tokens, which the slot's length then excludes, and causal attention keeps
  it out of the real tokens' logits. The slot keeps its length in a GPU tensor, so a replay needs no host
  synchronisation.
- `vision_kwargs` precomputes the grid-dependent tensors of the vision tower on the host, which removes
  its per-layer host synchronisations (`cu_seqlens.tolist()`).

What this module does not know: sessions, tokens, text. `qwen3vl.py` decides when to use it.
"""

from __future__ import annotations

import torch


class KVSlot:
    """A static KV cache of `max_len` tokens, seen through views of increasing length (`spans`).

    Attention over a static cache reads every position of it, masked or not: a decode step over a
    16k-token cache costs twice one over 4k. So each graph is captured against the shortest view that
    holds the conversation; all views share the same storage and the same length counter."""

    SPANS = (2048, 3072, 4096, 6144, 8192, 12288, 16384)

    def __init__(self, model, max_len: int, device: torch.device, dtype: torch.dtype):
        from transformers import StaticCache

        text = model.config.get_text_config()
        self.spans = tuple(sorted({s for s in self.SPANS if s < max_len} | {max_len}))
        self.max_len = max_len
        init = dict(batch_size=1, num_heads=text.num_key_value_heads, head_dim=text.head_dim, dtype=dtype, device=device)
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.cache.early_initialization(**init)
        self.views: dict[int, object] = {max_len: self.cache}
        for span in self.spans[:-1]:
            view = StaticCache(config=model.config, max_cache_len=span)
            view.early_initialization(**init)
            for full, part in zip(self.cache.layers, view.layers):
                part.keys = full.keys[:, :, :span]
                part.values = full.values[:, :, :span]
                part.cumulative_length = full.cumulative_length  # one counter for every view
            self.views[span] = view
        self.owner: str | None = None  # session id whose KV the slot holds
        self.length = 0  # host copy of the slot's length

    def span_for(self, end: int) -> int:
        """The shortest view that holds positions up to `end`."""
        return next(s for s in self.spans if s >= end)

    def set_length(self, n: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(n)
        self.length = n

    def load(self, dynamic, n: int, owner: str) -> None:
        """Copy the first `n` positions of a session's DynamicCache into the slot."""
        for src, dst in zip(dynamic.layers, self.cache.layers):
            if n:
                dst.keys[:, :, :n].copy_(src.keys[:, :, :n])
                dst.values[:, :, :n].copy_(src.values[:, :, :n])
        self.set_length(n)
        self.owner = owner

    def store(self, dynamic, start: int, end: int) -> None:
        """Append slot positions [start, end) to a session's DynamicCache holding exactly `start`."""
        if end <= start:
            return
        for src, dst in zip(self.cache.layers, dynamic.layers):
            k, v = src.keys[:, :, start:end], src.values[:, :, start:end]
            if dst.is_initialized and dst.keys is not None and dst.keys.numel():
                dst.keys = torch.cat([dst.keys[:, :, :start], k], dim=2)
                dst.values = torch.cat([dst.values[:, :, :start], v], dim=2)
            else:
                dst.lazy_initialization(k, v)
                dst.keys, dst.values = k.clone(), v.clone()


class GraphRunner:
    """Forward passes of fixed lengths over each view of a `KVSlot`, captured once and replayed."""

    def __init__(self, model, slot: KVSlot, sizes: tuple[int, ...] = (1, 16, 32, 64, 128)):
        self.model = model
        self.slot = slot
        self.sizes = tuple(sorted(sizes))
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.pool = None

    @property
    def max_prefill(self) -> int:
        return self.sizes[-1]

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, span: int) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=pos, cache=self.slot.views[span], use_cache=True)
        return out.logits  # [1, S, V]

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (size, view). Runs the model a few times on the slot, then restores its length."""
        device = self.slot.cache.layers[0].keys.device
        start = self.slot.length
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        for span in reversed(self.slot.spans):  # largest first, so later graphs reuse its memory pool
            for size in reversed(self.sizes):
                ids = torch.zeros(1, size, dtype=torch.long, device=device)
                pos = torch.zeros(3, 1, size, dtype=torch.long, device=device)
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self.slot.set_length(0)
                        self._forward(ids, pos, span)
                torch.cuda.current_stream(device).wait_stream(stream)
                self.slot.set_length(0)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    logits = self._forward(ids, pos, span)
                self.pool = graph.pool()
                self.graphs[(size, span)] = (graph, ids, pos, logits)
        self.slot.set_length(start)
        torch.cuda.synchronize(device)

    def run(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Append `ids [1, n]` at `pos [3, 1, n]` to the slot; logits of the last real position `[1, V]`."""
        n = ids.shape[1]
        size = next(s for s in self.sizes if s >= n)
        start = self.slot.length
        graph, ids_buf, pos_buf, logits = self.graphs[(size, self.slot.span_for(start + size))]
        ids_buf[:, :n].copy_(ids)
        pos_buf[:, :, :n].copy_(pos)
        if size > n:
            ids_buf[:, n:].zero_()
            pos_buf[:, :, n:].copy_(pos[:, :, -1:].expand(-1, -1, size - n))
        graph.replay()
        if size != n:
            self.slot.set_length(start + n)  # forget the padding's KV
        else:
            self.slot.length = start + n
        return logits[:, n - 1]


def vision_kwargs(grid: torch.Tensor, visual, config) -> dict:
    """The vision tower's grid-dependent inputs, computed once per screen size. `cu_seqlens` stays on
    the host so that the per-layer split needs no device round trip."""
    from transformers import vision_utils as vu

    kwargs: dict = {}
    indices, weights = vu.get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=config.spatial_merge_size,
    )
    kwargs["interp_indices"], kwargs["interp_weights"] = indices, weights
    kwargs["position_ids"] = vu.get_vision_position_ids(grid, visual.spatial_merge_size)
    cu = vu.get_vision_cu_seqlens(grid.cpu())
    kwargs["cu_seqlens"] = cu
    kwargs["max_seqlen"] = int((cu[1:] - cu[:-1]).max())
    return kwargs
