"""The KV memory of batched decoding: one static K/V tensor per layer with a row per decoding turn.

`BatchKV` holds `[rows, kv_heads, row_tokens, head_dim]` keys and values per layer. A turn takes a free
row (`RowSlot`), loads its session's KV into it, decodes there in one batched step with the other rows
(`batch_step.py`) and copies the new positions back to the session's own cache at the end, exactly as
a lone turn does with the single `cuda_graphs.KVSlot`. So sessions keep their KV between turns
whatever row they decoded in, and a follow-up still prefills only its new tokens.

The last position of every row is scratch: a step writes the K/V of a row that is not decoding there
(the step always runs a fixed number of rows), so a row holds at most `row_tokens - 1` positions.

Memory: rows x row_tokens x 112 KiB on the 2B model in bf16 (16 rows of 4,096 tokens: 7 GiB), and the
engine never takes more than half of what is free once the model is loaded (`free_bytes`): a tray on a
small GPU gets fewer rows, or none, rather than running out of memory. Within that, `row_layout` sizes
the rows: 4,096 positions while `max_batch` such rows fit, else shorter ones down to 3,072 (a 1080p
screenshot turn and a 512-token reply) so that more turns decode together; a turn too long for a row
runs on the single-stream path.
"""

from __future__ import annotations

import os

import torch

from qvl_agent.engine.cuda_graphs import KVSlot

ROW_TOKENS = 4096  # positions per row when the memory holds every row at this length
ROW_TOKENS_MIN = 3072  # the shortest row: a 1080p screenshot's turn (~2,400 positions) and a 512-token reply
ROW_STEP = 256


def row_layout(max_batch: int, memory_bytes: int, bytes_per_token: int) -> tuple[int, int]:
    """(rows, positions per row) for up to `max_batch` turns in `memory_bytes` of KV: rows of ROW_TOKENS
    while `max_batch` of them fit, else the longest multiple of ROW_STEP that lets `max_batch` rows fit, but
    never below ROW_TOKENS_MIN; then as many rows of that length as fit, at most `max_batch`."""
    fit = memory_bytes // (max(max_batch, 1) * bytes_per_token) // ROW_STEP * ROW_STEP
    row_tokens = max(ROW_TOKENS_MIN, min(ROW_TOKENS, fit))
    return min(max_batch, memory_bytes // (row_tokens * bytes_per_token)), row_tokens


class _Layer:
    """One layer of a row: what `KVSlot.load`/`store` read and write."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class _Rows:
    def __init__(self, layers: list[_Layer]):
        self.layers = layers


class RowSlot(KVSlot):
    """One row of a `BatchKV`, used like the single `KVSlot` (load, store, lengths, owner), without
    graphs of its own: its positions advance in the batched step."""

    def __init__(self, batch: BatchKV, index: int):  # not KVSlot's: the row's memory is the batch's
        self.batch = batch
        self.index = index
        self.cache = _Rows([_Layer(k[index : index + 1], v[index : index + 1]) for k, v in batch.layers])
        self.max_len = batch.row_tokens - 1  # the last position is scratch
        self.spans = (self.max_len,)
        self.views = {}
        self.owner: str | None = None
        self.length = 0

    def set_length(self, n: int) -> None:
        self.length = n


class BatchKV:
    """`rows` rows of `row_tokens` positions each; `take()` hands out the lowest free row, so the rows in
    use stay packed at the front and the batched step runs the smallest bucket that covers them."""

    def __init__(self, model, rows: int, row_tokens: int, device: torch.device, dtype: torch.dtype):
        text = model.config.get_text_config()
        shape = (rows, text.num_key_value_heads, row_tokens, text.head_dim)
        self.row_tokens = row_tokens
        self.layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(text.num_hidden_layers)
        ]
        self.rows = [RowSlot(self, i) for i in range(rows)]
        self._free = set(range(rows))

    @staticmethod
    def bytes_per_row(model, row_tokens: int, dtype: torch.dtype) -> int:
        text = model.config.get_text_config()
        per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * text.head_dim
        return per_token * row_tokens * torch.empty((), dtype=dtype).element_size()

    @staticmethod
    def bytes_per_token(model, dtype: torch.dtype) -> int:
        return BatchKV.bytes_per_row(model, 1, dtype)

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, owner: str) -> RowSlot | None:
        """The lowest free row, now owned by `owner`; None when every row is in use."""
        if not self._free:
            return None
        row = self.rows[min(self._free)]
        self._free.discard(row.index)
        row.owner, row.length = owner, 0
        return row

    def give_back(self, row: RowSlot) -> None:
        row.owner, row.length = None, 0
        self._free.add(row.index)

    def in_use(self) -> int:
        """How many leading rows a step must run to cover every row in use."""
        used = [r.index for r in self.rows if r.index not in self._free]
        return max(used) + 1 if used else 0


def free_bytes(device: torch.device) -> int:
    """Memory free on `device` now: the GPU's free memory, or the machine's free RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # no such counter here: the memory setting alone decides
        return 2**62
