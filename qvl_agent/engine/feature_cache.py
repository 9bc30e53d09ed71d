"""Vision features kept by a hash of what the model sees, so the same screen is never encoded twice.

The key covers the screenshot's pixels, shape and layout (its `content_hash`), every preprocessing
setting and the model's identity (name, dtype, device), so a changed setting or another model can never
return stale features. The cache is LRU, bounded in bytes; an item larger than the bound is not stored.
A bound of 0 gives a cache that stores nothing.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Features:
    """One image's vision-tower output: merged tokens and the DeepStack levels."""

    embeds: torch.Tensor  # [n_tokens, D]
    deepstack: tuple[torch.Tensor, ...]  # levels x [n_tokens, D]
    grid_thw: tuple[int, int, int]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embeds, *self.deepstack))

    @property
    def n_tokens(self) -> int:
        return self.embeds.shape[0]


def feature_key(content_hash: str, preprocess_settings, model_identity: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(content_hash.encode())
    h.update(repr(preprocess_settings).encode())
    h.update(model_identity.encode())
    return h.hexdigest()


class FeatureCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Features] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Features | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item

    def put(self, key: str, features: Features) -> bool:
        """Store `features`; False when they are larger than the whole bound (nothing is evicted then)."""
        size = features.nbytes
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._items and self._bytes + size > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.nbytes
            self._items[key] = features
            self._bytes += size
            return True

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
