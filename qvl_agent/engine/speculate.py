"""Drafts for speculative greedy decoding: guesses of the next few reply tokens that one multi-token
forward then checks against the model's own greedy choices.

Two sources, both free to compute: the computer-use tool call's fixed JSON skeleton (the schema forces
it, so after `<tool_call>` the next dozen tokens are known), and prompt lookup (an n-gram of the reply's
last tokens found earlier in the conversation, e.g. a previous step's tool call or text the model
quotes from the screen). A draft only saves forwards: the verifier keeps a drafted token only where it
equals the model's greedy choice, so the output is exactly plain greedy decoding.

What this module does not know: tensors, the model, the KV cache.
"""

from __future__ import annotations

# Pieces of Qwen3-VL's computer-use tool call that do not depend on what the model decides.
SKELETONS = (
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "',
    '", "coordinate": [',
    "]}}\n</tool_call>",
    '", "text": "',
    '"}}\n</tool_call>',
    '{"bbox_2d": [',
    '{"point_2d": [',
)

MAX_DRAFT = 15  # verified in one forward of 16 tokens (the smallest prefill graph): ~1.25x one token


class Drafter:
    """Proposes continuations of `ids` (the whole context, then each token as it is accepted).

    Prompt lookup keys the last 3 or 2 tokens; the skeletons also match on their first token alone,
    which is distinctive (`<tool_call>`). Lookups are dictionary hits, so a proposal costs microseconds
    however long the conversation is."""

    SIZES = (3, 2)

    def __init__(self, ids: list[int], skeletons: list[list[int]] = ()):
        self.ids: list[int] = []
        self.last: dict[tuple[int, ...], int] = {}  # n-gram -> index just after its latest occurrence
        self.skeleton: dict[tuple[int, ...], tuple[list[int], int]] = {}
        for doc in skeletons:
            for end in range(1, len(doc)):
                for n in (*self.SIZES, 1):
                    if end >= n and (n > 1 or end == 1):
                        self.skeleton.setdefault(tuple(doc[end - n : end]), (doc, end))
        self.extend(ids)

    def extend(self, ids: list[int]) -> None:
        for token in ids:
            end = len(self.ids)  # n-grams ending here now have a continuation: `token`
            for n in self.SIZES:
                if end >= n:
                    self.last[tuple(self.ids[end - n : end])] = end
            self.ids.append(token)

    def propose(self, limit: int = MAX_DRAFT) -> list[int]:
        """Up to `limit` tokens that might follow; empty when nothing matches."""
        if limit <= 0:
            return []
        end = len(self.ids)
        for n in self.SIZES:
            at = self.last.get(tuple(self.ids[end - n :])) if end >= n else None
            if at is not None:
                return self.ids[at : at + limit]
        for n in (*self.SIZES, 1):
            hit = self.skeleton.get(tuple(self.ids[end - n :])) if end >= n else None
            if hit is not None:
                doc, at = hit
                return doc[at : at + limit]
        return []


def skeleton_ids(tokenizer) -> list[list[int]]:
    """The skeleton pieces as token ids of `tokenizer`."""
    return [tokenizer.encode(s, add_special_tokens=False) for s in SKELETONS]


def accepted_count(drafts: list[int], choices: list[int]) -> int:
    """How many drafts in a row equal the verifier's choices (`choices[i]` follows `drafts[:i]`)."""
    m = 0
    while m < len(drafts) and choices[m] == drafts[m]:
        m += 1
    return m
