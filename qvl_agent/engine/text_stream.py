"""Streaming text: generated ids to text pieces, with stop strings held back. Plain strings and ids, no torch,
so the server's text-only paths (a replay or remote engine behind `serve`) start without it."""

from __future__ import annotations


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
