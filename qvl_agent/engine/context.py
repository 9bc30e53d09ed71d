"""A conversation as token ids, built with the processor's own chat template.

`Context` is what a session's KV cache holds: token ids plus, for each image, its feature key and where
its placeholder tokens sit. A new turn extends the previous context token-exactly (the generated ids
stay as generated; only the template's new text is tokenized) whenever the rendered conversation still
starts with the text the context stands for; otherwise the whole conversation is tokenized again and
the KV cache keeps the longest prefix that still matches, image by image.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageSpan:
    key: str  # feature-cache key of the image
    start: int  # index of its first placeholder token
    length: int  # number of placeholder tokens (merged visual tokens)
    grid_thw: tuple[int, int, int]

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class Context:
    ids: list[int] = field(default_factory=list)
    images: list[ImageSpan] = field(default_factory=list)
    text: str = ""  # the rendered template text these ids stand for

    def extended(self, ids: list[int], images: list[ImageSpan], text: str) -> Context:
        offset = len(self.ids)
        moved = [ImageSpan(s.key, s.start + offset, s.length, s.grid_thw) for s in images]
        return Context(self.ids + ids, self.images + moved, self.text + text)


def tokenize_with_images(
    tokenizer, text: str, image_token: str, image_token_id: int, images: list[tuple[str, int, tuple]]
) -> tuple[list[int], list[ImageSpan]]:
    """Token ids of `text` with each image placeholder expanded to its visual-token count.

    `images` lists `(key, n_tokens, grid_thw)` in order of appearance. Placeholders are always
    surrounded by special tokens (vision_start/vision_end), so tokenizing the pieces between them
    separately gives the same ids as tokenizing the whole text."""
    pieces = text.split(image_token)
    if len(pieces) - 1 != len(images):
        raise ValueError(f"template has {len(pieces) - 1} image placeholders for {len(images)} images")
    ids: list[int] = []
    spans: list[ImageSpan] = []
    for i, piece in enumerate(pieces):
        if piece:
            ids.extend(tokenizer.encode(piece, add_special_tokens=False))
        if i < len(images):
            key, n, grid = images[i]
            spans.append(ImageSpan(key, len(ids), n, grid))
            ids.extend([image_token_id] * n)
    return ids, spans


def reusable_prefix(cached: Context, target: Context) -> int:
    """How many leading tokens of `target` the cache of `cached` can keep: the longest common prefix
    of ids, cut back to before the first image whose content differs or that the prefix splits, and
    short of the whole target (the last token must run to give logits)."""
    n = 0
    limit = min(len(cached.ids), len(target.ids) - 1)
    a, b = cached.ids, target.ids
    while n < limit and a[n] == b[n]:
        n += 1
    cached_by_start = {s.start: s for s in cached.images}
    for span in target.images:
        if span.start >= n:
            break
        other = cached_by_start.get(span.start)
        if other is None or other.key != span.key or span.end > n:
            return span.start
    return n
