"""The feature cache is keyed by what the model sees and bounded in bytes."""

import torch

from qvl_agent.engine.feature_cache import FeatureCache, Features, feature_key
from qvl_agent.engine.preprocess import PreprocessSettings
from qvl_agent.image import Screenshot


def _features(n_tokens: int, dim: int = 8) -> Features:
    return Features(torch.zeros(n_tokens, dim), (torch.zeros(n_tokens, dim),) * 3, (1, 2, 2))


def test_byte_bound_holds_and_evicts_least_recently_used():
    one = _features(16).nbytes
    cache = FeatureCache(max_bytes=3 * one)
    for key in "abc":
        assert cache.put(key, _features(16))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("d", _features(16))
    assert cache.nbytes <= 3 * one
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("d") is not None


def test_item_larger_than_bound_is_skipped_without_evicting_others():
    cache = FeatureCache(max_bytes=_features(16).nbytes)
    cache.put("small", _features(16))
    assert not cache.put("huge", _features(1000))
    assert cache.get("huge") is None and cache.get("small") is not None


def test_zero_bound_stores_nothing():
    cache = FeatureCache(max_bytes=0)
    assert not cache.put("a", _features(1))
    assert len(cache) == 0


def test_key_separates_same_bytes_in_another_shape_settings_or_model():
    data = bytes(range(256)) * 48  # 12288 bytes: 64x64x3 or 32x128x3 or 64x48x4
    square = Screenshot(data, 64, 64, "RGB")
    wide = Screenshot(data, 128, 32, "RGB")
    bgra = Screenshot(data, 64, 48, "BGRA")
    s = PreprocessSettings()
    keys = {
        feature_key(square.content_hash, s, "m"),
        feature_key(wide.content_hash, s, "m"),
        feature_key(bgra.content_hash, s, "m"),
        feature_key(square.content_hash, PreprocessSettings(max_pixels=100_000), "m"),
        feature_key(square.content_hash, s, "other-model"),
    }
    assert len(keys) == 5
    again = Screenshot(bytes(data), 64, 64, "RGB")
    assert feature_key(again.content_hash, s, "m") == feature_key(square.content_hash, s, "m")
