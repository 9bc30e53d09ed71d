"""Prompt prefill and speculation's verify pass through the fused pieces (`engine/fast_prefill.py`), on a
CPU in fp32 against one full transformers forward.

What a person would notice if this broke: a first token or a follow-up's answer that differs from plain
transformers on the same screenshot (a wrong position, a DeepStack feature added at the wrong token, a
token that sees a later one), a reply that goes wrong after the prompt (K/V written at the wrong place),
or speculation that keeps a drafted token plain decoding would not have chosen.
"""

import pytest
import torch
from transformers import AutoProcessor, DynamicCache

from qvl_agent.config import Settings
from qvl_agent.engine.context import Context
from qvl_agent.engine.cuda_graphs import GraphRunner, KVSlot
from qvl_agent.engine.fast_prefill import FastPrefill
from qvl_agent.engine.qwen3vl import Qwen3VLEngine
from qvl_agent.image import Screenshot
from tests.support.models import two_b_widths

SETTINGS = Settings(device="cpu", compile=False)


@pytest.fixture(scope="module", params=["tiny", "2b widths"])
def engine(request, tiny_model_dir):
    if request.param == "tiny":
        return Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=SETTINGS)
    processor = AutoProcessor.from_pretrained(str(tiny_model_dir))
    return Qwen3VLEngine(two_b_widths(tiny_model_dir), processor, name="2b widths", settings=SETTINGS)


def _shot() -> Screenshot:
    pixels = torch.randint(0, 256, (64, 96, 3), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    return Screenshot(pixels.numpy().tobytes(), 96, 64, "RGB")


def _bucket(n: int) -> int:
    return next(s for s in GraphRunner.PREFILL_SIZES if s >= n)


def _padded(x: torch.Tensor, size: int, dim: int, fill: torch.Tensor | None = None) -> torch.Tensor:
    """`x` padded along `dim` to `size` with zeros, or with `fill` repeated: what a captured bucket's
    buffers hold past the real tokens (`GraphRunner.run_prefill`)."""
    n = x.shape[dim]
    shape = list(x.shape)
    shape[dim] = size - n
    pad = torch.zeros(shape, dtype=x.dtype) if fill is None else fill.expand(shape)
    return torch.cat([x, pad], dim=dim)


@torch.inference_mode()
def test_a_screenshot_prompt_and_a_follow_up_prefilled_in_buckets_give_transformers_logits_and_kv(engine):
    """A screenshot's prompt in two chunks (the split inside the image's tokens, so DeepStack features
    cross it), then 17 follow-up tokens as one pass that returns every position's logits (speculation's
    verify pass), each padded to its bucket as a captured graph is: every position's logits and the
    slot's K/V are those of one full forward over the whole conversation."""
    model = engine.model
    session = engine.open_session([_shot()])
    target, _ = session._target("Describe the screen.", (_shot(),))
    follow = torch.randint(10, 200, (17,), generator=torch.Generator().manual_seed(2)).tolist()
    whole = Context(target.ids + follow, target.images, "")
    feats, *_ = engine.encode_images([(_shot(), target.images[0].key)])
    ids = torch.tensor([whole.ids])
    pos = engine.positions(whole)
    length = ids.shape[1]
    reference = DynamicCache(config=model.config)
    full = engine.forward(ids, pos, reference, feats, keep=length)  # one full transformers forward

    layers = engine.fused_weights()
    slot = KVSlot(model, 3072, torch.device("cpu"), torch.float32)
    prefill = FastPrefill(model, layers)
    embeds, deepstack = engine.embed(ids, [span.start for span in whole.images], feats)
    dense = []
    for index, values in deepstack:
        level = torch.zeros_like(embeds)
        level[0].index_copy_(0, index, values)
        dense.append(level)
    image = whole.images[0]
    assert image.length > 4
    cuts = [0, image.start + 2, len(target.ids), length]
    logits = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        size = _bucket(b - a)
        hidden = prefill(
            _padded(embeds[:, a:b], size, 1),
            _padded(pos[:, :, a:b], size, 2, fill=pos[:, :, b - 1 : b]),
            slot.views[2048],  # a shorter view than the slot, as on a GPU
            [_padded(d[:, a:b], size, 1) for d in dense],
        )
        assert int(slot.cache.layers[-1].cumulative_length) == a + size  # every layer advanced once
        slot.set_length(b)  # forget the padding's K/V, as `run_prefill` does
        logits.append(model.lm_head(hidden[0, : b - a]))
    torch.testing.assert_close(torch.cat(logits), full, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(slot.cache.layers, reference.layers, strict=True):
        torch.testing.assert_close(mine.keys[:, :, :length], theirs.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine.values[:, :, :length], theirs.values, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_padded_token_never_changes_a_real_one(engine):
    """The same 20 tokens alone and padded to a bucket of 32 with junk: the real positions' hidden
    states are equal, since no real token attends to a later position."""
    model = engine.model
    lm = model.model.language_model
    prefill = FastPrefill(model, engine.fused_weights())
    ids = torch.randint(10, 200, (1, 20), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(20).view(1, 1, -1).expand(3, 1, -1)
    alone = prefill(lm.embed_tokens(ids), pos, KVSlot(model, 2048, torch.device("cpu"), torch.float32).cache, [])
    junk = torch.randn(1, 12, model.config.text_config.hidden_size, generator=torch.Generator().manual_seed(4))
    padded = prefill(
        torch.cat([lm.embed_tokens(ids), junk], 1),
        torch.arange(32).view(1, 1, -1).expand(3, 1, -1),
        KVSlot(model, 2048, torch.device("cpu"), torch.float32).cache,
        [],
    )
    torch.testing.assert_close(padded[:, :20], alone, rtol=1e-5, atol=1e-5)
