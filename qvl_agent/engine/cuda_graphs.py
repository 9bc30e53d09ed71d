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
- `greedy_chain` runs several decode steps in one graph, each fed the previous step's greedy choice on
  the device (`GraphRunner.chains`, captured with the compiled step): one replay and one host sync per
  k tokens instead of per token.
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
        init = dict(
            batch_size=1,
            num_heads=text.num_key_value_heads,
            head_dim=text.head_dim,
            dtype=dtype,
            device=device,
        )
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.cache.early_initialization(**init)
        self.views: dict[int, object] = {max_len: self.cache}
        for span in self.spans[:-1]:
            view = StaticCache(config=model.config, max_cache_len=span)
            view.early_initialization(**init)
            for full, part in zip(self.cache.layers, view.layers, strict=True):
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
        for src, dst in zip(dynamic.layers, self.cache.layers, strict=True):
            if n:
                dst.keys[:, :, :n].copy_(src.keys[:, :, :n])
                dst.values[:, :, :n].copy_(src.values[:, :, :n])
        self.set_length(n)
        self.owner = owner

    def store(self, dynamic, start: int, end: int) -> None:
        """Append slot positions [start, end) to a session's DynamicCache holding exactly `start`."""
        from qvl_agent.errors import EngineError

        held = dynamic.get_seq_length()
        if held != start or end > self.length:
            raise EngineError(f"Internal engine error: storing KV [{start}, {end}) onto {held} positions.")
        if end <= start:
            return
        for src, dst in zip(self.cache.layers, dynamic.layers, strict=True):
            k, v = src.keys[:, :, start:end], src.values[:, :, start:end]
            if dst.is_initialized and dst.keys is not None and dst.keys.numel():
                dst.keys = torch.cat([dst.keys[:, :, :start], k], dim=2)
                dst.values = torch.cat([dst.values[:, :, :start], v], dim=2)
            else:
                dst.lazy_initialization(k, v)
                dst.keys, dst.values = k.clone(), v.clone()
        if dynamic.get_seq_length() != end:
            raise EngineError(f"Internal engine error: stored KV holds {dynamic.get_seq_length()}, not {end}.")


def text_forward(model, embeds: torch.Tensor, pos: torch.Tensor, cache, deepstack: list[torch.Tensor]) -> torch.Tensor:
    """The language model over `embeds [1, S, H]` at `pos [3, 1, S]`, DeepStack features added as dense
    `[1, S, H]` tensors (zero away from image tokens) instead of boolean-mask scatters, so the whole pass
    has static shapes and no host synchronisation. Returns the final hidden states `[1, S, H]`; the
    numbers are those of transformers' own forward (adding 0 changes nothing)."""
    from transformers.masking_utils import create_causal_mask

    lm = model.model.language_model
    mask = create_causal_mask(
        config=lm.config, inputs_embeds=embeds, attention_mask=None, cache=cache, position_ids=None
    )
    position_embeddings = lm.rotary_emb(embeds, pos)
    hidden = embeds
    for i, layer in enumerate(lm.layers):
        hidden = layer(
            hidden,
            attention_mask=mask,
            position_ids=None,
            cache=cache,
            position_embeddings=position_embeddings,
        )
        if i < len(deepstack):
            hidden = hidden + deepstack[i]
    return lm.norm(hidden)


class GraphRunner:
    """Forward passes of fixed lengths over each view of a `KVSlot`, captured once and replayed:
    a decode step (one token id), and prefills of embeddings padded to a bucket of lengths."""

    PREFILL_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048, 2560, 3072, 4096)

    def __init__(self, model, slot: KVSlot, prefill_sizes: tuple[int, ...] = PREFILL_SIZES):
        self.model = model
        self.slot = slot
        self.sizes = tuple(sorted(prefill_sizes))
        self.levels = len(model.config.vision_config.deepstack_visual_indexes)
        self.decode: dict[int, tuple] = {}  # span -> (graph, ids, pos, logits)
        self.chains: dict[tuple[int, int], tuple] = {}  # (k, span) -> (graph, ids, pos, forced, picks)
        self.prefill: dict[tuple[int, int], tuple] = {}  # (size, span) -> (graph, embeds, pos, deepstack, hidden)
        self.fused_prefill: set[tuple[int, int]] = set()  # buckets captured again over `FastPrefill`
        self.pool = None
        self.problem = ""  # why prefill graphs are off, when they are

    def _capture(self, fn, warmups: int = 2, thread_local: bool = False):
        device = self.slot.cache.layers[0].keys.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmups):
                self.slot.set_length(0)
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.slot.set_length(0)
        graph = torch.cuda.CUDAGraph()
        # A capture from a background thread (the compiled step) must not trip over other threads.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local" if thread_local else "global"):
            out = fn()
        self.pool = graph.pool()
        return graph, out

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture the decode step for every view, then the prefill buckets (largest first, so the
        smaller graphs reuse the memory pool). A prefill capture that fails leaves decoding on graphs."""
        device = self.slot.cache.layers[0].keys.device
        dtype = self.slot.cache.layers[0].keys.dtype
        hidden_size = self.model.config.get_text_config().hidden_size
        start = self.slot.length
        try:
            for span in reversed(self.slot.spans):
                for size in reversed(self.sizes):
                    if size > span:
                        continue
                    embeds = torch.zeros(1, size, hidden_size, dtype=dtype, device=device)
                    pos = torch.zeros(3, 1, size, dtype=torch.long, device=device)
                    deepstack = [torch.zeros_like(embeds) for _ in range(self.levels)]
                    cache = self.slot.views[span]
                    graph, hidden = self._capture(
                        lambda e=embeds, p=pos, d=deepstack, c=cache: text_forward(self.model, e, p, c, d)
                    )
                    self.prefill[(size, span)] = (graph, embeds, pos, deepstack, hidden)
        except Exception as exc:  # keep whatever was captured before; decode graphs still help
            self.problem = f"prefill graphs: {type(exc).__name__}: {exc}"
            self.prefill.clear()
        for span in reversed(self.slot.spans):
            ids = torch.zeros(1, 1, dtype=torch.long, device=device)
            pos = torch.zeros(3, 1, 1, dtype=torch.long, device=device)
            cache = self.slot.views[span]
            graph, logits = self._capture(
                lambda i=ids, p=pos, c=cache: self.model(input_ids=i, position_ids=p, cache=c, use_cache=True).logits
            )
            self.decode[span] = (graph, ids, pos, logits)
        self.slot.set_length(start)
        torch.cuda.synchronize(device)

    def prefill_size(self, n: int, start: int | None = None) -> int | None:
        """The bucket a prefill of `n` tokens after `start` positions (the slot's length when not given)
        runs in, None when no captured graph can take it."""
        start = self.slot.length if start is None else start
        size = next((s for s in self.sizes if s >= n), None)
        if size is None or start + size > self.slot.max_len:
            return None
        return size if (size, self.slot.span_for(start + size)) in self.prefill else None

    def run_prefill(
        self, embeds: torch.Tensor, pos: torch.Tensor, deepstack: list[tuple], all_logits: bool = False
    ) -> torch.Tensor:
        """Append `embeds [1, n, H]` at `pos [3, 1, n]` to the slot. `deepstack` lists, per level,
        `(index of image tokens [k], features [k, H])`. Returns the last real position's logits `[1, V]`,
        or with `all_logits` every real position's `[n, V]` (verifying drafted tokens)."""
        n = embeds.shape[1]
        size = self.prefill_size(n)
        start = self.slot.length
        graph, emb_buf, pos_buf, ds_bufs, hidden = self.prefill[(size, self.slot.span_for(start + size))]
        emb_buf[:, :n].copy_(embeds)
        emb_buf[:, n:].zero_()
        pos_buf[:, :, :n].copy_(pos)
        pos_buf[:, :, n:].copy_(pos[:, :, -1:].expand(-1, -1, size - n))
        for buf, level in zip(ds_bufs, deepstack or [None] * len(ds_bufs), strict=True):
            buf.zero_()
            if level is not None:
                buf[0].index_copy_(0, level[0], level[1].to(buf.dtype))
        graph.replay()
        self.slot.set_length(start + n)  # forget the padding's KV
        if all_logits:
            return self.model.lm_head(hidden[0, :n])
        return self.model.lm_head(hidden[:, n - 1])

    def run_decode(self, token: int | torch.Tensor, position: int) -> torch.Tensor:
        """Append one token id (an int, or a 0-d tensor on the device: no host sync) at `position`; its
        logits `[1, V]`."""
        start = self.slot.length
        graph, ids_buf, pos_buf, logits = self.decode[self.slot.span_for(start + 1)]
        ids_buf.fill_(token)
        pos_buf.fill_(position)
        graph.replay()
        self.slot.length = start + 1
        return logits[:, -1]

    def run_chain(self, token: int, position: int, k: int, forced: int) -> torch.Tensor | None:
        """`k` greedy decode steps in one replay (see `greedy_chain`) from `token` at `position`; the k
        chosen ids `[k]`, still on the device. The slot then holds `token` and the first k-1 of them.
        None when no chain of `k` steps is captured for the view this needs."""
        start = self.slot.length
        if start + k > self.slot.max_len:
            return None
        entry = self.chains.get((k, self.slot.span_for(start + k)))
        if entry is None:
            return None
        graph, ids_buf, pos_buf, forced_buf, picks = entry
        ids_buf.fill_(token)
        pos_buf.fill_(position)
        forced_buf.fill_(forced)
        graph.replay()
        self.slot.length = start + k
        return picks


def greedy_pick(logits: torch.Tensor, banned: torch.Tensor, eos: torch.Tensor, forbid_eos) -> torch.Tensor:
    """The greedy choice `[1]` from `logits [1, V]`: never a `banned` id, and no `eos` id while
    `forbid_eos` (a bool, or a bool tensor on the device so that a captured graph can decide)."""
    logits = logits.index_fill(1, banned, float("-inf"))
    if isinstance(forbid_eos, torch.Tensor):
        logits = torch.where(forbid_eos, logits.index_fill(1, eos, float("-inf")), logits)
    elif forbid_eos:
        logits = logits.index_fill(1, eos, float("-inf"))
    return logits.argmax(dim=-1)


def greedy_chain(step, ids: torch.Tensor, pos: torch.Tensor, forced: torch.Tensor, k: int, banned, eos) -> torch.Tensor:
    """`k` decode steps, each fed the previous step's greedy choice on the device: the ids `[k]`.
    `step(ids, pos)` appends one token and returns logits `[1, 1, V]`; `ids [1, 1]` and `pos [3, 1, 1]`
    are the first step's inputs and advance in place; end tokens are not chosen in the first `forced`
    (a 0-d tensor) steps (`min_new_tokens`)."""
    picks = []
    for j in range(k):
        pick = greedy_pick(step(ids, pos)[:, -1], banned, eos, forced > j)
        picks.append(pick)
        ids.copy_(pick.view(1, 1))
        pos.add_(1)
    return torch.cat(picks)


def vision_kwargs(grid: torch.Tensor, visual, config) -> dict:
    """The vision tower's grid-dependent inputs, computed once per screen size. `cu_seqlens` stays on
    the host so that the per-layer split needs no device round trip."""
    from transformers import vision_utils as vu

    kwargs: dict = {}
    indices, weights = vu.get_vision_interpolation_indices_and_weights(
        grid,
        num_grid_per_side=visual.num_grid_per_side,
        mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners,
        spatial_merge_size=config.spatial_merge_size,
    )
    kwargs["interp_indices"], kwargs["interp_weights"] = indices, weights
    kwargs["position_ids"] = vu.get_vision_position_ids(grid, visual.spatial_merge_size)
    cu = vu.get_vision_cu_seqlens(grid.cpu())
    kwargs["cu_seqlens"] = cu
    kwargs["max_seqlen"] = int((cu[1:] - cu[:-1]).max())
    return kwargs
