"""The real transformers path with the tiny random Qwen3-VL on CPU: feature reuse, KV reuse, isolation.

The reference for every comparison is plain transformers: the reference processor's pixel_values and a
full forward with no cache, so our preprocessing, positions, cached features and KV reuse are all checked
against what the library computes by itself.
"""

import dataclasses

import numpy as np
import pytest
import torch

from qvl_agent.config import Settings
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.qwen3vl import Qwen3VLEngine
from qvl_agent.image import Screenshot

OPTS = GenerationOptions(max_new_tokens=12)


def _shot(width: int, height: int, seed: int) -> Screenshot:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    alpha = np.zeros((height, width, 1), np.uint8)
    return Screenshot.from_array(np.concatenate([rgb[..., ::-1], alpha], -1), "BGRA")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Qwen3VLEngine.load(str(tiny_model_dir), device="cpu")


class PrefillLogits:
    """Records the logits of the first forward of each turn (the prefill) via a hook on lm_head."""

    def __init__(self, engine):
        self.calls: list[torch.Tensor] = []
        self.handle = engine.model.lm_head.register_forward_hook(lambda m, i, o: self.calls.append(o[0, -1].clone()))

    def turn(self, session, text, images=()):
        start = len(self.calls)
        reply = session.complete(text, images, OPTS)
        return self.calls[start], reply

    def close(self):
        self.handle.remove()


@pytest.fixture
def prefill(engine):
    rec = PrefillLogits(engine)
    yield rec
    rec.close()


@torch.inference_mode()
def reference_logits(engine, ids: list[int], shots: list[Screenshot]) -> torch.Tensor:
    """Last-position logits of a full forward through plain transformers (no cache, no reuse)."""
    engine.model.model.rope_deltas = None
    input_ids = torch.tensor([ids])
    kwargs = {}
    if shots:
        ref = engine.processor.image_processor(images=[s.to_pil() for s in shots], return_tensors="pt")
        kwargs = dict(
            pixel_values=ref["pixel_values"],
            image_grid_thw=ref["image_grid_thw"],
            mm_token_type_ids=(input_ids == engine.image_token_id).int(),
        )
    return engine.model(input_ids=input_ids, **kwargs).logits[0, -1]


def turn_ids(session) -> list[int]:
    """The prompt ids of the session's last turn, as it ran."""
    return session.context.ids[: session.last_stats.prompt_tokens]


def test_first_turn_matches_plain_transformers(engine, prefill):
    shot = _shot(640, 480, 1)
    session = engine.open_session([shot])
    logits, _ = prefill.turn(session, "What is on this screen?")
    torch.testing.assert_close(logits, reference_logits(engine, turn_ids(session), [shot]), rtol=1e-4, atol=1e-4)


def test_cache_hit_skips_vision_tower_and_gives_identical_logits(engine, prefill):
    shot = _shot(500, 300, 2)
    first = engine.open_session([shot])
    miss_logits, miss_reply = prefill.turn(first, "Describe it.")
    assert first.last_stats.vision == "miss"
    runs = engine.vision_runs

    second = engine.open_session([shot])  # a new session: no KV to reuse, only the features
    hit_logits, hit_reply = prefill.turn(second, "Describe it.")
    assert engine.vision_runs == runs, "the vision tower ran again for an image it had already seen"
    assert second.last_stats.vision == "hit" and second.last_stats.vision_ms == 0
    assert second.last_stats.prefill_tokens == first.last_stats.prefill_tokens
    assert torch.equal(hit_logits, miss_logits)
    assert hit_reply == miss_reply


def test_follow_up_reuses_kv_and_matches_full_recompute(engine, prefill):
    shot = _shot(800, 600, 3)
    session = engine.open_session([shot])
    prefill.turn(session, "What is this?")
    first = session.last_stats

    logits, _ = prefill.turn(session, "And the title?")
    second = session.last_stats
    assert second.vision == "hit"
    assert second.prefill_tokens < first.prefill_tokens / 10
    assert second.cached_tokens + second.prefill_tokens == second.prompt_tokens
    torch.testing.assert_close(logits, reference_logits(engine, turn_ids(session), [shot]), rtol=1e-4, atol=1e-4)


def test_follow_up_right_after_a_turn_on_another_image_size(engine, prefill):
    small, large = _shot(320, 240, 4), _shot(1280, 720, 5)
    a = engine.open_session([small])
    prefill.turn(a, "What is this?")
    first_prompt = a.last_stats.prompt_tokens
    b = engine.open_session([large])
    prefill.turn(b, "What is this?")  # leaves the model's hidden rope state on another grid
    engine.model.model.rope_deltas = torch.tensor([[12345]])  # and make it stale on purpose

    logits, _ = prefill.turn(a, "Tell me more.")
    assert a.last_stats.cached_tokens > first_prompt  # the whole first turn came from the KV cache
    torch.testing.assert_close(logits, reference_logits(engine, turn_ids(a), [small]), rtol=1e-4, atol=1e-4)


def test_new_screenshot_in_a_later_turn_is_appended_not_recomputed(engine, prefill):
    step1, step2 = _shot(640, 400, 6), _shot(640, 400, 7)
    session = engine.open_session()
    prefill.turn(session, "Step one.", [step1])
    before = session.last_stats.prompt_tokens
    logits, _ = prefill.turn(session, "Step two.", [step2])
    stats = session.last_stats
    assert stats.vision == "miss" and stats.cached_tokens >= before
    torch.testing.assert_close(
        logits, reference_logits(engine, turn_ids(session), [step1, step2]), rtol=1e-4, atol=1e-4
    )


def test_sessions_do_not_see_each_others_state(engine, prefill):
    red, blue = _shot(400, 400, 8), _shot(600, 300, 9)
    a, b = engine.open_session([red], system="You are terse."), engine.open_session([blue])
    prefill.turn(a, "What colour?")
    prefill.turn(b, "What shape?")
    la, _ = prefill.turn(a, "Sure?")
    lb, _ = prefill.turn(b, "Really?")
    assert "What shape?" not in a.context.text and "What colour?" not in b.context.text
    torch.testing.assert_close(la, reference_logits(engine, turn_ids(a), [red]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lb, reference_logits(engine, turn_ids(b), [blue]), rtol=1e-4, atol=1e-4)


def test_idle_sessions_lose_their_kv_under_the_memory_cap_and_still_answer(tiny_model_dir, prefill):
    engine = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=Settings(session_memory_mb=0))
    rec = PrefillLogits(engine)
    try:
        shot = _shot(320, 320, 10)
        a = engine.open_session([shot])
        rec.turn(a, "First?")
        b = engine.open_session([_shot(320, 320, 11)])
        rec.turn(b, "Other?")
        assert a.kv_bytes() == 0, "an idle session kept its KV cache over the cap"
        logits, _ = rec.turn(a, "Again?")
        assert a.last_stats.cached_tokens == 0 and a.last_stats.vision == "hit"
        torch.testing.assert_close(logits, reference_logits(engine, turn_ids(a), [shot]), rtol=1e-4, atol=1e-4)
    finally:
        rec.close()


def test_history_from_a_stateless_client_reuses_the_matching_prefix(engine):
    shot = _shot(480, 320, 12)
    original = engine.open_session([shot])
    reply = original.complete("What is this?", options=OPTS)
    replayed = engine.open_session()
    replayed.add_turn("What is this?", [shot], reply)
    replayed.complete("And then?", options=OPTS)
    assert replayed.last_stats.vision == "hit"


def test_cancel_stops_between_tokens_and_session_stays_usable(engine):
    from qvl_agent.errors import GenerationCancelled

    session = engine.open_session([_shot(320, 240, 13)])
    stream = session.ask("Go on.", options=GenerationOptions(max_new_tokens=200))
    pieces = []
    with pytest.raises(GenerationCancelled):
        for i, piece in enumerate(stream):
            pieces.append(piece)
            if i == 2:
                session.cancel()
    assert session.last_stats.decode_tokens < 200
    assert session.turns[-1].reply == "".join(pieces)  # the partial answer is part of the conversation
    session.complete("Next?", options=OPTS)
    assert session.last_stats.cached_tokens > 0 and session.last_stats.vision == "hit"


def test_cancel_right_after_ask_is_not_lost(engine):
    from qvl_agent.errors import GenerationCancelled

    session = engine.open_session([_shot(320, 240, 13)])
    stream = session.ask("Go on.", options=GenerationOptions(max_new_tokens=200))
    session.cancel()  # before the first piece is read
    with pytest.raises(GenerationCancelled):
        list(stream)


def test_a_failed_turn_leaves_no_trace_in_the_conversation(engine):
    from qvl_agent.errors import ImageError

    shot = _shot(320, 240, 17)
    session = engine.open_session([shot])
    with pytest.raises(ImageError):
        session.complete("Look.", [Screenshot(bytes(3 * 5000 * 10), 5000, 10, "RGB")], OPTS)  # 500:1
    assert session.turns == []
    session.complete("Look again.", options=OPTS)
    assert session.turns[0].images == (shot,)  # the opening image was kept for the next question


def test_stop_strings_and_fixed_lengths(engine):
    session = engine.open_session([_shot(320, 240, 14)])
    long = session.complete("Count.", options=GenerationOptions(max_new_tokens=40, min_new_tokens=40))
    assert session.last_stats.decode_tokens == 40
    stop = long.strip()[5:8]
    cut = engine.open_session([_shot(320, 240, 14)]).complete(
        "Count.", options=GenerationOptions(max_new_tokens=40, min_new_tokens=40, stop=(stop,))
    )
    assert stop not in cut and long.startswith(cut)


def test_sampling_options_are_honoured(engine):
    shot = _shot(320, 240, 15)
    greedy = engine.open_session([shot]).complete("Anything.", options=OPTS)
    torch.manual_seed(0)
    nucleus_of_one = engine.open_session([shot]).complete(
        "Anything.", options=dataclasses.replace(OPTS, temperature=1.0, top_p=0.0)
    )
    assert nucleus_of_one == greedy  # top_p = 0 keeps only the most likely token
    samples = set()
    for seed in range(4):
        torch.manual_seed(seed)
        samples.add(
            engine.open_session([shot]).complete("Anything.", options=dataclasses.replace(OPTS, temperature=2.0))
        )
    assert samples != {greedy}  # a hot temperature wanders off the greedy path


@torch.inference_mode()
def test_graph_friendly_prefill_matches_plain_transformers(engine):
    """The static-shape prefill the GPU captures (dense DeepStack, embeddings written in place) computes
    what transformers computes; run eagerly here, on the CPU."""
    from transformers import DynamicCache

    from qvl_agent.engine.cuda_graphs import text_forward

    shot = _shot(640, 360, 16)
    session = engine.open_session([shot])
    session.complete("Where is the button?", options=OPTS)
    from qvl_agent.engine.context import Context

    ids = turn_ids(session)
    target = Context(ids, session.cached.images)
    feats, *_ = engine.encode_images([(shot, target.images[0].key)])
    embeds, deepstack = engine.embed(torch.tensor([ids]), [target.images[0].start], feats)
    dense = []
    for index, values in deepstack:
        level = torch.zeros_like(embeds)
        level[0].index_copy_(0, index, values)
        dense.append(level)
    hidden = text_forward(
        engine.model, embeds, engine.positions(target), DynamicCache(config=engine.model.config), dense
    )
    logits = engine.model.lm_head(hidden[:, -1])[0]
    torch.testing.assert_close(logits, reference_logits(engine, ids, [shot]), rtol=1e-4, atol=1e-4)
