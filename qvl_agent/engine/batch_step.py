"""One decode step for many conversations at once: each row of a `BatchKV` appends one token at its
own position, and every row's logits come back from one pass over the weights.

The arithmetic is the single stream's fused step (`fast_step.pieces`: q/k/v and gate/up each one matrix
product over the weights `fuse_weights` concatenated, the norms, RoPE and SiLU between them), for `n` rows
instead of one. What differs is only how a row's K/V is written and read, since rows hold conversations
of different lengths:

- the new K/V is written at each row's own length (`keys[row, :, at[row]]`);
- attention masks each row to its own positions and reads each K/V head once for the query heads of its
  group (SDPA's `enable_gqa`, or the query heads as the rows of one query: the step's `attention`);
- rows that are not decoding run too (the step has a fixed number of rows) and write their K/V at the
  row's scratch position, the last one, which no conversation uses.

On a GPU each (rows, KV view) pair is captured once as a CUDA graph for the row buckets 1, 2, 4 ... 64
and the shortest KV view (every 512 positions) that holds every decoding row, so a step is one replay
whatever the batch; and once the compiled pieces are built in the background (`compiled_decode.py`),
`use_pieces` captures the graphs again over them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qvl_agent.engine.batch_kv import BatchKV
from qvl_agent.engine.fast_step import LayerWeights, Pieces, pieces

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# KV views every 512 positions from 2,048 on: attention reads a view's every row up to its end, and is
# most of a batched step, so rows of a 1080p turn (~2,100-2,400 positions) read 2,560, not 3,072.
SPAN_STEP, FIRST_SPAN = 512, 2048


class BatchStep:
    def __init__(self, model, kv: BatchKV, layers: list[LayerWeights], attention: str = "gqa"):
        text = model.config.get_text_config()
        self.kv, self.layers = kv, layers
        self.lm = model.model.language_model
        self.norm = self.lm.norm.weight.detach()
        self.head = model.lm_head.weight.detach()
        self.scale = self.lm.layers[0].self_attn.scaling
        self.attention = attention
        self.pieces = pieces(text, attention)
        rows = len(kv.rows)
        self.buckets = tuple(b for b in BUCKETS if b < rows) + (rows,)
        self.spans = (*range(FIRST_SPAN, kv.row_tokens, SPAN_STEP), kv.row_tokens)
        device = kv.layers[0][0].device
        self.device = device
        # Inputs of the step, reused by every call (and read by the captured graphs).
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(3, rows, 1, dtype=torch.long, device=device)
        self.at = torch.full((rows,), kv.row_tokens - 1, dtype=torch.long, device=device)
        # Two pinned staging buffers taken in turn: a step launched before the host has read the previous
        # one's picks must not overwrite inputs whose copy to the device may still be queued.
        pinned = device.type == "cuda"
        self._host = [torch.zeros(3 * rows, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._calls = 0
        self._picked = torch.zeros(rows, dtype=torch.long, pin_memory=pinned)
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, span) -> (graph, logits)
        self.problem = ""  # why graphs are off, when they are
        self._ranges = {s: torch.arange(s, device=device) for s in self.spans}
        self._rows = {b: torch.arange(b, device=device) for b in self.buckets}

    def shape_for(self, rows: int, end: int) -> tuple[int, int]:
        """The bucket of rows covering the first `rows`, and the KV view holding positions below `end`."""
        bucket = next(b for b in self.buckets if b >= rows)
        return bucket, next(s for s in self.spans if s >= end)

    def forward(self, rows: int, span: int) -> torch.Tensor:
        """The step over the first `rows` rows and KV view `span`, from the input buffers: logits `[rows, V]`."""
        n, p = rows, self.pieces
        ids, pos, at = self.ids[:n], self.pos[:, :n], self.at[:n]
        h = self.lm.embed_tokens(ids)  # [n, 1, H]
        cos, sin = self.lm.rotary_emb(h, pos)
        mask = (self._ranges[span] <= at.view(n, 1)).view(n, 1, 1, span)
        index = self._rows[n]
        for (keys, values), w in zip(self.kv.layers, self.layers, strict=True):
            q, k, v = p.attn_in(h, w.ln1, w.qkv, w.q_norm, w.k_norm, cos, sin)
            keys[index, :, at] = k[:, :, 0]
            values[index, :, at] = v[:, :, 0]
            o = F.scaled_dot_product_attention(
                q,
                keys[:n, :, :span],
                values[:n, :, :span],
                attn_mask=mask,
                scale=self.scale,
                enable_gqa=self.attention == "gqa",
            )
            h = p.attn_out_mlp(h, o, w.o, w.ln2, w.gate_up, w.down)
        return p.final(h, self.norm, self.head)[:, 0]

    def use_pieces(self, compiled: Pieces) -> None:
        """Run on `compiled` pieces (the same arithmetic, compiled) from now on: on a GPU the graphs are
        captured again over them. Call between two steps."""
        self.pieces = compiled
        if self.graphs:
            self.graphs.clear()  # before capturing: the old graphs' memory goes back first
            self.capture()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture a CUDA graph per (row bucket, KV view), largest first so smaller ones reuse the
        memory pool. Every row's writes go to its scratch position meanwhile: capture runs the step for
        real. A failure keeps the graphs captured so far; the rest runs eagerly."""
        pool = None
        self.at.fill_(self.kv.row_tokens - 1)
        try:
            for span in reversed(self.spans):
                for rows in reversed(self.buckets):
                    stream = torch.cuda.Stream(self.device)
                    stream.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(stream):
                        for _ in range(2):
                            self.forward(rows, span)
                    torch.cuda.current_stream(self.device).wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        logits = self.forward(rows, span)
                    pool = graph.pool()
                    self.graphs[(rows, span)] = (graph, logits)
        except Exception as exc:
            self.problem = f"batched decode graphs: {type(exc).__name__}: {exc}"
        torch.cuda.synchronize(self.device)

    def picks(self, logits: torch.Tensor, queued: bool) -> Picks:
        """The greedy picks of a step's `logits [rows, V]`; with `queued`, their copy to the host is
        queued right away, so that a step launched next does not delay reading them."""
        return Picks(logits.argmax(dim=-1), self._picked if queued else None)

    def __call__(self, tokens: dict[int, tuple[int, int]], picked: torch.Tensor | None = None) -> torch.Tensor:
        """Append `tokens[row] = (token id, M-RoPE position)` to each decoding row; logits `[rows, V]`
        for the rows `0..rows-1` the step ran (row `r`'s in line `r`). Rows advance by one. With `picked`
        (the previous step's picks `[rows]`, still on the device), each row's token is its pick there and
        the ids in `tokens` are not read: the step needs no host sync before it."""
        rows_in_use = self.kv.in_use()
        end = max(self.kv.rows[r].length for r in tokens) + 1
        rows, span = self.shape_for(rows_in_use, end)
        scratch = self.kv.row_tokens - 1
        ids, pos, at = [0] * rows, [0] * rows, [scratch] * rows
        for r, (token, position) in tokens.items():
            ids[r], pos[r], at[r] = token, position, self.kv.rows[r].length
        # One host-to-device copy for all three. This pinned buffer is written again two calls on, when
        # the caller has synchronised on this step's picks (so the copy has run).
        self._calls += 1
        host = self._host[self._calls % 2][: 3 * rows].view(3, rows)
        host.copy_(torch.tensor([ids, pos, at], dtype=torch.long))
        staged = host.to(self.device, non_blocking=True)
        self.ids[:rows, 0].copy_(staged[0] if picked is None else picked[:rows])
        self.pos[:, :rows, 0].copy_(staged[1].expand(3, rows))
        self.at[:rows].copy_(staged[2])
        entry = self.graphs.get((rows, span))
        if entry is not None:
            entry[0].replay()
            logits = entry[1]
        else:
            logits = self.forward(rows, span)
        for r in tokens:
            self.kv.rows[r].length += 1
        return logits


class Picks:
    """A step's greedy picks `[rows]` on the device. Given a pinned buffer on a GPU, their copy to the
    host is queued at once, so reading them (`tolist`) waits for that step only, not for a step launched
    after it from `device`."""

    def __init__(self, device: torch.Tensor, pinned: torch.Tensor | None):
        self.device = device
        self._ready = None
        self._host = device  # read as it is: `tolist` then waits for everything queued before it
        if pinned is not None and device.is_cuda:
            self._host = pinned[: len(device)]
            self._host.copy_(device, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def tolist(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()  # lets go of the GIL while it waits: stream readers run meanwhile
        return self._host.tolist()
