"""Token selection: a pure tensor helper for the decode loop. `TextStream` (ids to text pieces) lives in
`text_stream.py`, which imports no torch, and is re-exported here."""

from __future__ import annotations

import torch

from qvl_agent.engine.text_stream import TextStream

__all__ = ["TextStream", "select_token"]


def select_token(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator=None,
    top_k: int = 0,
    presence_penalty: float = 0.0,
    seen: torch.Tensor | None = None,
    frequency_penalty: float = 0.0,
) -> torch.Tensor:
    """`logits [1, V]` -> `[1, 1]` token on the same device: argmax when temperature is 0, else
    sampling with (in this order) presence and frequency penalties on the ids in `seen [n]` (the reply
    so far; OpenAI's definitions: once per token seen, and once per time it was seen), the temperature,
    a top-k cut and a nucleus (top-p) cut; 0 turns each of top_k and the penalties off.
    Stays on the device; the caller decides when to synchronise."""
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    if (presence_penalty or frequency_penalty) and seen is not None and seen.numel():
        logits = logits.clone()
        if presence_penalty:
            logits[:, seen.unique()] -= presence_penalty
        if frequency_penalty:
            counts = torch.bincount(seen, minlength=logits.shape[-1])[: logits.shape[-1]]  # [V]
            logits -= frequency_penalty * counts.to(logits.dtype)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
        keep[..., 0] = True  # the top token always stays, even with top_p = 0
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return order.gather(-1, choice)
    return torch.multinomial(probs, 1, generator=generator)
