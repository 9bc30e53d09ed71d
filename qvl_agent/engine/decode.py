"""Token selection and streaming text: pure tensor and string helpers for the decode loop."""

from __future__ import annotations

import torch


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


class TextStream:
    """Turns generated ids into text pieces. Holds back an incomplete UTF-8 sequence and any tail that
    could still become a stop string, so nothing past a stop string is ever shown.

    Each token decodes only a short window of ids (the ones since the last complete text), so the cost
    per token stays flat however long the reply grows."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.shown = ""  # text of the ids up to `self.read`, all characters complete
        self.prefix = 0  # window start: ids before it are never decoded again
        self.read = 0  # ids whose text is in `self.shown`
        self.emitted = 0  # characters of `self.shown` already yielded
        self.stopped = False

    def text(self) -> str:
        """The whole reply's text, decoded in one go (exact, for the conversation record)."""
        return self._decode(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add a token; return the text that can be shown now (may be empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        window = self._decode(self.ids[self.prefix :])
        if window.endswith("\ufffd") or len(window) <= len(before):
            return ""  # a multi-byte character is not complete yet
        self.shown += window[len(before) :]
        self.prefix, self.read = self.read, len(self.ids)
        text = self.shown
        for s in self.stop:
            at = text.find(s, max(0, self.emitted - len(s)))
            if at >= 0:
                self.stopped = True
                return self._take(text, at)
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return self._take(text, len(text) - hold)

    def flush(self) -> str:
        """What is left once generation ends without a stop string."""
        return "" if self.stopped else self._take(self.text(), None)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        piece = text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return piece
