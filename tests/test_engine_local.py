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


def _conversation(engine, shot, opts):
    session = engine.open_session([shot])
    replies = [session.complete(q, options=opts) for q in ("Describe it.", "Describe it again.", "And again.")]
    return replies, list(session.context.ids), session


def test_speculative_decoding_gives_exactly_the_greedy_reply_with_fewer_forwards(engine):
    shot = _shot(320, 240, 20)
    opts = GenerationOptions(max_new_tokens=40, min_new_tokens=40)
    engine.speculative = False
    try:
        plain, plain_ids, _ = _conversation(engine, shot, opts)
    finally:
        engine.speculative = True
    fast, fast_ids, session = _conversation(engine, shot, opts)
    assert fast == plain and fast_ids == plain_ids
    assert session.last_stats.draft_accepted > 0  # the tiny model repeats itself: drafts were kept


def test_a_forced_tool_call_is_drafted_from_its_skeleton_and_later_tokens_stay_greedy(engine):
    shot = _shot(320, 240, 21)
    call = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}'
    forced = tuple(engine.tokenizer.encode(call, add_special_tokens=False))
    opts = GenerationOptions(max_new_tokens=len(forced) + 12, min_new_tokens=len(forced) + 12, force_ids=forced)
    replies = {}
    for on in (False, True):
        engine.speculative = on
        session = engine.open_session([shot])
        replies[on] = session.complete("Click it.", options=opts)
        accepted = session.last_stats.draft_accepted
    engine.speculative = True
    assert replies[True] == replies[False] and replies[True].startswith(call)
    assert accepted >= 10  # the skeleton after <tool_call> needed no forward of its own


def test_draft_accepted_counts_only_drafted_tokens_that_reach_the_reply(engine):
    """A stop string can end the reply inside a run of verified drafts: the tokens after it were never
    shown, so they are not counted as accepted either."""
    shot = _shot(320, 240, 23)
    reply = "The Save button is at the top left of the window, next to Open and Close."
    forced = tuple(engine.tokenizer.encode(reply, add_special_tokens=False))
    opts = GenerationOptions(max_new_tokens=len(forced), force_ids=forced)
    session = engine.open_session([shot])
    session.complete("Where is Save?", options=opts)
    # Asked again, the same reply is found earlier in the conversation: drafted in long runs and kept.
    assert session.complete("Where is Save?", options=opts) == reply
    assert 0 < session.last_stats.draft_accepted < session.last_stats.decode_tokens == len(forced)
    session = engine.open_session([shot])
    session.complete("Where is Save?", options=opts)
    cut = dataclasses.replace(opts, stop=("top",))
    assert session.complete("Where is Save?", options=cut) == "The Save button is at the "
    stats = session.last_stats
    assert stats.decode_tokens < len(forced)
    assert stats.draft_accepted == stats.decode_tokens - 1  # every token after the first, and no more


def test_speculation_can_be_turned_off_in_settings():
    from qvl_agent.config import load

    assert Settings().speculative
    assert not load(env={"QVL_SPECULATE": "0", "QVL_CONFIG_DIR": "/nonexistent-qvl"}).settings.speculative


def test_the_conversation_is_what_the_processor_renders_for_the_whole_history(engine):
    """The engine extends each turn token-exactly; the result must be the processor's own rendering of
    the whole conversation, images expanded, not just the engine's idea of it. (Replies are forced to
    their canonical tokens: a model may write a reply in other tokens, which the engine keeps as they are.)"""
    shot = _shot(480, 320, 22)
    session = engine.open_session([shot], system="Be brief.")
    for question, reply in (("What is this?", "A window."), ("Where is the button?", "At the bottom."), ("Title?", "")):
        forced = (*engine.tokenizer.encode(reply, add_special_tokens=False), engine.im_end_id)
        session.complete(question, options=GenerationOptions(max_new_tokens=len(forced), force_ids=forced))
        assert session.turns[-1].reply == reply
    messages = [{"role": "system", "content": "Be brief."}]
    for i, turn in enumerate(session.turns):
        content = [{"type": "image"}] * (i == 0) + [{"type": "text", "text": turn.text}]
        messages.append({"role": "user", "content": content})
        if i < len(session.turns) - 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": turn.reply}]})
    rendered = engine.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = engine.processor(text=[rendered], images=[shot.to_pil()], return_tensors="pt")["input_ids"][0]
    assert turn_ids(session) == expected.tolist()
    assert session.last_stats.cached_tokens > len(expected) // 2  # and it still reused the earlier turns


def test_a_long_prefill_is_cancelled_between_chunks_and_the_next_turn_works(tiny_model_dir):
    import threading

    from qvl_agent.errors import GenerationCancelled

    engine = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu")
    engine.prefill_chunk = 64
    rec = PrefillLogits(engine)
    calls = []

    def cancel_from_another_thread(module, args):
        calls.append(1)
        if len(calls) == 2:  # the second chunk: a client hangs up while the prompt runs
            t = threading.Thread(target=session.cancel)
            t.start()
            t.join()

    shot = _shot(320, 240, 23)
    session = engine.open_session([shot])
    hook = engine.model.model.language_model.layers[0].register_forward_pre_hook(cancel_from_another_thread)
    try:
        with pytest.raises(GenerationCancelled):
            session.complete("Read all of this: " + "word " * 400, options=OPTS)
    finally:
        hook.remove()
    assert len(calls) == 2  # stopped right after the chunk that was running, of ~8
    logits, reply = rec.turn(session, "Short question.")
    rec.close()
    assert session.last_stats.decode_tokens == OPTS.max_new_tokens or reply == session.turns[-1].reply
    torch.testing.assert_close(logits, reference_logits(engine, turn_ids(session), [shot]), rtol=1e-4, atol=1e-4)


def test_a_second_stream_on_the_same_thread_is_refused_not_run_on_the_first_ones_kv(engine):
    from qvl_agent.errors import EngineError

    a, b = engine.open_session([_shot(320, 240, 24)]), engine.open_session([_shot(320, 240, 25)])
    first = a.ask("Go on.", options=GenerationOptions(max_new_tokens=30, min_new_tokens=30))
    next(first)  # a turn is now streaming and holds the model
    with pytest.raises(EngineError, match="still streaming"):
        b.complete("Interleaved?", options=OPTS)
    rest = list(first)
    assert a.last_stats.decode_tokens == 30 and rest is not None
    b.complete("Now?", options=OPTS)
    assert b.last_stats.decode_tokens == OPTS.max_new_tokens or b.turns[-1].reply


def test_an_end_token_the_template_never_renders_does_not_enter_the_kv(engine):
    from qvl_agent.engine.context import tokenize_with_images

    shot = _shot(320, 240, 26)
    session = engine.open_session([shot])
    ids = engine.tokenizer.encode("Done", add_special_tokens=False)
    endoftext = engine.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert endoftext in engine.eos_ids and endoftext != engine.im_end_id
    session.complete("Finish.", options=GenerationOptions(max_new_tokens=10, force_ids=(*ids, endoftext)))
    ctx = session.context
    assert ctx.ids[-1] == engine.im_end_id and endoftext not in ctx.ids
    entries = [engine.image_entry(shot)]
    retokenized, _ = tokenize_with_images(
        engine.tokenizer, ctx.text, engine.image_token, engine.image_token_id, entries
    )
    assert retokenized == ctx.ids  # ids and text of the finished turn agree
    assert endoftext not in session.cached.ids
    session.complete("Next.", options=OPTS)
    assert session.last_stats.cached_tokens == len(ctx.ids) - 1  # the whole turn reused, up to its end token


def test_a_prefetched_screenshot_leaves_only_the_question_to_run(engine, prefill):
    shot = _shot(640, 400, 27)
    session = engine.open_session()
    session.prefetch([shot])  # while the person types
    runs = engine.vision_runs
    logits, _ = prefill.turn(session, "What is on this screen?")
    stats = session.last_stats
    assert engine.vision_runs == runs  # the tower ran during the prefetch, not after Enter
    assert stats.vision == "miss" and stats.vision_ms > 0  # the turn still reports the work its image cost
    assert stats.cached_tokens > stats.prompt_tokens - 20 and stats.prefill_tokens < 20
    assert session.turns[0].images == (shot,)
    torch.testing.assert_close(logits, reference_logits(engine, turn_ids(session), [shot]), rtol=1e-4, atol=1e-4)
