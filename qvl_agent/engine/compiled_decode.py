"""A `torch.compile`d decode step, built in the background and swapped in between turns.

The plain CUDA graphs (`cuda_graphs.py`) replay transformers' eager kernels: ~7 ms a token on an H200.
Compiling the same step fuses norms, RoPE and the small ops around attention, ~3.5 ms a token, but costs
~50 s per KV view cold (~8 s from inductor's on-disk cache). So serving starts at once on the plain graphs
and `BackgroundSwap` builds the compiled step on a thread:

- `prepare(item)` runs outside the engine's lock: compiling, against a scratch KV slot of the same layout,
  so that the slot a conversation is using is never written;
- `install(item, prepared)` runs under the engine's lock, i.e. between turns: it captures the compiled
  step in a CUDA graph over the real slot and replaces that view's plain decode graph.

A failure leaves the plain graphs that are already there, and `status` says why. The inductor cache is
kept per GPU model and torch build, keyed by everything that changes the generated code
(`compile_cache.py`), so a second start, or one after `qvl-agent warm-up`, reuses it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import torch

from qvl_agent.engine.compile_cache import cache_key, use_cache_dir

COMPILED = "compiled"
BATCH = "batch"  # the batched step's item, after the single stream's views
PREFILL = "prefill"  # the prefill buckets' items, ("prefill", size, span), last
__all__ = ["COMPILED", "BackgroundSwap", "cache_key", "compiled_decode_swap", "use_cache_dir"]


class BackgroundSwap:
    """Prepare replacements for `items` on a thread and install each under `lock` (between turns)."""

    def __init__(self, lock, items: Sequence, prepare: Callable, install: Callable):
        self.lock = lock
        self.items = list(items)
        self.prepare = prepare
        self.install = install
        self.done = 0
        self.error = ""
        self.seconds = 0.0  # from start to the last install (or the failure)
        self.cache_folder = ""  # where the compiled code is cached (`compile_cache.use_cache_dir`)
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qvl-compile", daemon=True)

    def start(self) -> BackgroundSwap:
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                for item in self.items:
                    prepared = self.prepare(item)
                    with self.lock:
                        self.install(item, prepared)
                    self.done += 1
        except Exception as exc:  # the plain graphs keep serving; the status says why
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self.seconds = time.perf_counter() - t0
            self._finished.set()

    @property
    def status(self) -> str:
        if self.error:
            return f"compile failed after {self.done}/{len(self.items)}: {self.error}"
        if self.done == len(self.items):
            return COMPILED
        return f"compiling {self.done}/{len(self.items)}"

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every item is installed or the build failed; True when all are installed."""
        self._finished.wait(timeout)
        return self._finished.is_set() and not self.error


def compiled_decode_swap(engine, mode: str = "default") -> BackgroundSwap:
    """The background build of a compiled decode step for every view of `engine.fast`'s KV slot,
    shortest view first (most conversations are short). The step is `fast_step.FastStep` with its
    element-wise pieces compiled when the engine fused its weights (`engine.step_weights`), else
    transformers' forward compiled whole. With `engine.decode_steps` > 1 each view also gets a chain of
    that many greedy steps in one graph (`cuda_graphs.greedy_chain`). Last, the batched step
    (`engine.batcher`) gets the same pieces compiled for any number of rows, and its graphs again; with
    `fast_prefill`, every captured prefill bucket is captured again over `fast_prefill.FastPrefill`,
    its pieces compiled once for every length, largest bucket first (as `GraphRunner.capture`)."""
    from qvl_agent.engine.cuda_graphs import KVSlot, greedy_chain
    from qvl_agent.engine.fast_prefill import FastPrefill
    from qvl_agent.engine.fast_step import FastStep

    runner = engine.fast
    slot = runner.slot
    model = engine.model
    gpu = torch.cuda.get_device_name(engine.device)
    batch = engine.batcher.step if engine.batcher is not None and engine.step_weights is not None else None
    shapes = (slot.max_len, *slot.spans, *(("batch", *batch.buckets, *batch.spans) if batch else ()))
    key = cache_key(model.config.to_dict(), shapes, torch.__version__, gpu, str(engine.dtype))
    folder = use_cache_dir(key, gpu, torch.__version__)
    # Same layout as the real slot (views are slices of `max_len`-long tensors), so the code compiled
    # here passes its guards there and installing needs no second compile.
    scratch = KVSlot(model, slot.max_len, engine.device, engine.dtype)

    if engine.step_weights is not None:
        step = FastStep(
            model, engine.step_weights, compile=lambda f: torch.compile(f, mode=mode, dynamic=False, fullgraph=True)
        )
    else:

        def forward(ids, pos, cache):
            return model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True).logits

        step = torch.compile(forward, mode=mode, fullgraph=False)
    device = engine.device
    k = engine.decode_steps
    banned, eos = engine.banned_ids, torch.tensor(engine.eos_list, device=device)
    buckets = []  # the prefill graphs to capture again over the compiled pieces
    if engine.settings.fast_prefill and engine.step_weights is not None:
        buckets = [(PREFILL, size, span) for size, span in sorted(runner.prefill, reverse=True)]
    prefill: list[FastPrefill] = []  # compiled on the first bucket's turn

    def prepare(span) -> object:
        if span == BATCH:
            return _compiled_batch_pieces(batch, mode)
        if isinstance(span, tuple):  # (PREFILL, size, span)
            if not prefill:
                prefill.append(_compiled_prefill(model, engine.step_weights, mode))
            return prefill[0]
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        pos = torch.zeros(3, 1, 1, dtype=torch.long, device=device)
        for _ in range(2):
            scratch.set_length(0)
            step(ids, pos, scratch.views[span])
        torch.cuda.synchronize(device)
        if span == slot.spans[-1]:
            scratch.views.clear()
            scratch.cache = None  # the scratch slot's memory goes back before the last install

    def install(span, prepared) -> None:
        if span == BATCH:
            batch.use_pieces(prepared)
            return
        if isinstance(span, tuple):  # (PREFILL, size, span)
            _capture_prefill(runner, span[1:], prepared)
            return
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        pos = torch.zeros(3, 1, 1, dtype=torch.long, device=device)
        length, cache = slot.length, slot.views[span]
        # The capture's warm-up writes the slot's first positions: the next turn reloads its session's KV.
        slot.owner = None
        graph, logits = runner._capture(lambda: step(ids, pos, cache), thread_local=True)
        chain = None
        if k > 1 and span >= k:
            c_ids, c_pos = torch.zeros_like(ids), torch.zeros_like(pos)
            forced = torch.zeros((), dtype=torch.long, device=device)
            c_graph, picks = runner._capture(
                lambda: greedy_chain(lambda i, p: step(i, p, cache), c_ids, c_pos, forced, k, banned, eos),
                thread_local=True,
            )
            chain = (c_graph, c_ids, c_pos, forced, picks)
        slot.set_length(length)
        torch.cuda.synchronize(device)
        runner.decode[span] = (graph, ids, pos, logits)
        if chain is not None:
            runner.chains[(k, span)] = chain

    swap = BackgroundSwap(engine.lock, (*slot.spans, *((BATCH,) if batch else ()), *buckets), prepare, install)
    swap.cache_folder = folder
    return swap


def _compiled_batch_pieces(batch, mode: str):
    """The batched step's pieces compiled, for one row and for any number (automatic dynamic shapes: the
    second size seen makes the rows dimension symbolic), built on dummy inputs: the pieces read no KV,
    so compiling touches nothing a running batch uses."""
    from qvl_agent.engine.fast_step import pieces

    compiled = pieces(batch.lm.config, batch.attention, lambda f: torch.compile(f, mode=mode, fullgraph=True))
    for n in (2, 4, 1):
        warm_pieces(compiled, batch.lm.config, batch.layers[0], n, 1, batch.attention, (batch.norm, batch.head))
    return compiled


def _compiled_prefill(model, layers, mode: str):
    """`FastPrefill` with its pieces compiled for any number of tokens (automatic dynamic shapes: the
    second length seen makes the tokens dimension symbolic), built on dummy inputs like the batch's."""
    from qvl_agent.engine.fast_prefill import FastPrefill

    prefill = FastPrefill(model, layers, compile=lambda f: torch.compile(f, mode=mode, fullgraph=True))
    for t in (16, 32):
        warm_pieces(prefill.pieces, prefill.lm.config, layers[0], 1, t, "packed")
    return prefill


def warm_pieces(p, text, w, n: int, t: int, attention: str, final: tuple | None = None) -> None:
    """Run the pieces `p` once for `n` rows of `t` tokens on dummy inputs laid out as a real step's are
    (cos and sin apart, attention's output from SDPA itself, so with its strides): compiled pieces guard
    on aliasing and strides, and inputs unlike the real ones would compile everything a second time at
    the first real step, under the engine's lock. `final` is (norm, head) to run `p.final` too."""
    like = dict(device=w.qkv.device, dtype=w.qkv.dtype)
    h = torch.zeros(n, t, text.hidden_size, **like)
    cos, sin = (torch.zeros(n, t, text.head_dim, **like) for _ in range(2))
    q, k, v = p.attn_in(h, w.ln1, w.qkv, w.q_norm, w.k_norm, cos, sin)
    mask = torch.ones(n, 1, q.shape[2], t, dtype=torch.bool, device=h.device)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=attention == "gqa")
    h = p.attn_out_mlp(h, o, w.o, w.ln2, w.gate_up, w.down)
    if final is not None:
        p.final(h, *final)
    if h.device.type == "cuda":
        torch.cuda.synchronize(h.device)


def _capture_prefill(runner, bucket: tuple[int, int], prefill) -> None:
    """Capture the prefill graph of `bucket` (size, span) again over `prefill`, on the same input
    buffers, and replace the plain one. Under the engine's lock: the capture's warm-up writes the slot's
    first positions, so the next turn reloads its session's KV."""
    slot = runner.slot
    _, embeds, pos, deepstack, _ = runner.prefill[bucket]
    length, cache = slot.length, slot.views[bucket[1]]
    slot.owner = None
    graph, hidden = runner._capture(lambda: prefill(embeds, pos, cache, deepstack), thread_local=True)
    slot.set_length(length)
    torch.cuda.synchronize(embeds.device)
    runner.prefill[bucket] = (graph, embeds, pos, deepstack, hidden)
    runner.fused_prefill.add(bucket)
