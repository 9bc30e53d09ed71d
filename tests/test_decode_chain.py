"""The hand-written decode step and chained greedy steps, on CPU with the tiny random Qwen3-VL.

What a person would notice if these broke: a reply that differs from plain greedy decoding (wrong
numbers in the fused step, a chain that feeds the wrong id forward, an end token or `min_new_tokens`
handled differently inside a chain), a follow-up that answers from a KV holding tokens past the reply's
end, or a cancel that does not stop the turn. Every reference is the engine decoding one token per step
(`decode_steps = 1`) or plain transformers' own forward.
"""

import dataclasses

import numpy as np
import pytest
import torch

from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.batch_kv import BatchKV
from qvl_agent.engine.batch_step import BatchStep
from qvl_agent.engine.context import Context
from qvl_agent.engine.cuda_graphs import KVSlot, text_forward
from qvl_agent.engine.fast_step import FastStep, fuse_weights, supported
from qvl_agent.engine.kv_state import SessionKV
from qvl_agent.engine.qwen3vl import DECODE_STEPS, Qwen3VLEngine
from qvl_agent.errors import GenerationCancelled
from qvl_agent.image import Screenshot
from tests.support.models import two_b_widths


def _shot(width: int, height: int, seed: int) -> Screenshot:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    alpha = np.zeros((height, width, 1), np.uint8)
    return Screenshot.from_array(np.concatenate([rgb[..., ::-1], alpha], -1), "BGRA")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Qwen3VLEngine.load(str(tiny_model_dir), device="cpu")


@pytest.fixture
def steps(engine):
    """Set `engine.decode_steps` (and speculation) per call; both are restored afterwards."""
    saved = engine.decode_steps, engine.speculative

    def set_(k: int, speculative: bool = False):
        engine.decode_steps, engine.speculative = k, speculative

    yield set_
    engine.decode_steps, engine.speculative = saved


def _conversation(engine, shot, first: GenerationOptions, second: GenerationOptions):
    session = engine.open_session([shot])
    replies = [session.complete("Describe the screen.", options=first), session.complete("More.", options=second)]
    return replies, list(session.context.ids), session


IDS = torch.randint(0, 500, (1, 20), generator=torch.Generator().manual_seed(0))
POS = torch.arange(20).view(1, 1, -1).expand(3, 1, -1)


@pytest.fixture(scope="module", params=["tiny", "2b widths"])
@torch.inference_mode()
def fused(request, tiny_model_dir):
    """(model with fused weights, its LayerWeights, one full forward's logits over IDS from before fusing)."""
    from transformers import Qwen3VLForConditionalGeneration

    if request.param == "tiny":
        model = Qwen3VLForConditionalGeneration.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    else:
        model = two_b_widths(tiny_model_dir)
    assert supported(model) == ""
    before = model(input_ids=IDS, position_ids=POS).logits[0]  # one full forward: the reference
    params = sum(p.numel() for p in model.parameters())
    layers = fuse_weights(model)
    # The model's own Linears now view the fused tensors: same numbers, no second copy of the weights.
    assert torch.equal(model(input_ids=IDS, position_ids=POS).logits[0], before)
    attn = model.model.language_model.layers[0].self_attn
    assert attn.k_proj.weight.untyped_storage().data_ptr() == layers[0].qkv.untyped_storage().data_ptr()
    assert sum(p.numel() for p in model.parameters()) == params
    return model, layers, before


@pytest.mark.parametrize("attention", ["gqa", "packed"])
@torch.inference_mode()
def test_the_fast_step_gives_transformers_logits_and_fusing_changes_no_weight(fused, attention):
    model, layers, before = fused
    slot = KVSlot(model, 3072, torch.device("cpu"), torch.float32)
    step, view = FastStep(model, layers, attention=attention), slot.views[2048]  # a shorter view, as on a GPU
    logits = torch.cat([step(IDS[:, i : i + 1], POS[:, :, i : i + 1], view)[:, -1] for i in range(20)])
    torch.testing.assert_close(logits, before, rtol=1e-4, atol=1e-4)  # teacher-forced, token by token
    assert int(slot.cache.layers[-1].cumulative_length) == 20  # every layer's length advanced once a step


@pytest.mark.parametrize("attention", ["gqa", "packed"])
@torch.inference_mode()
def test_the_batched_step_gives_every_row_transformers_logits(fused, attention):
    """Three conversations of different lengths decode together in rows 0, 2 and 3 (row 1 idle, written
    only at its scratch position), teacher-forced token by token: each row's logits are those of one full
    forward over its own conversation, through the same fused pieces as the single stream's step."""
    model, layers, before = fused
    kv = BatchKV(model, 4, 64, torch.device("cpu"), torch.float32)
    step = BatchStep(model, kv, layers, attention=attention)
    conversations = {0: IDS[0], 2: IDS[0, 7:], 3: torch.flip(IDS[0, :11], [0])}
    rows = [kv.take(f"s{n}") for n in range(4)]
    kv.give_back(rows[1])
    full = {
        r: model(input_ids=ids.view(1, -1), position_ids=POS[:, :, : len(ids)]).logits[0]
        for r, ids in conversations.items()
    }
    assert torch.equal(full[0], before)
    got: dict[int, list] = {r: [] for r in conversations}
    for i in range(20):
        tokens = {r: (int(ids[i]), i) for r, ids in conversations.items() if i < len(ids)}
        logits = step(tokens)
        for r in tokens:
            got[r].append(logits[r])
    for r, ids in conversations.items():
        torch.testing.assert_close(torch.stack(got[r]), full[r], rtol=1e-4, atol=1e-4)
        assert kv.rows[r].length == len(ids)
    assert kv.rows[1].length == 0 and not kv.layers[0][0][1, :, :-1].any()  # the idle row: scratch only


@torch.inference_mode()
def test_a_prompt_prefilled_in_the_single_slot_decodes_on_in_a_batch_row_exactly(fused):
    """A batched turn whose prompt ran as one prefill on the engine's single slot (a captured bucket on
    a GPU; here the same forward, eagerly) goes on in its batch row: the row gets every position the slot
    held, its next tokens' logits are one full forward's (teacher-forced), the slot no longer speaks for
    the session, and at the end the session's own cache holds exactly what the row ran."""
    model, layers, before = fused
    lm = model.model.language_model
    slot = KVSlot(model, 3072, torch.device("cpu"), torch.float32)
    batch = BatchKV(model, 2, 64, torch.device("cpu"), torch.float32)
    step = BatchStep(model, batch, layers)
    ids = IDS[0].tolist()
    kv = SessionKV(model.config, "s")
    target = Context(ids[:12], [], "")
    assert kv.prepare(target) == 0
    slot.load(kv.cache, 0, "s")
    kv.attach(slot)
    hidden = text_forward(model, lm.embed_tokens(IDS[:, :12]), POS[:, :, :12], slot.views[2048], [])
    slot.set_length(12)  # as `GraphRunner.run_prefill` does after its replay
    kv.ran(target, 12)
    torch.testing.assert_close(model.lm_head(hidden[0]), before[:12], rtol=1e-4, atol=1e-4)

    row = batch.take("s")
    kv.continue_on(row)
    assert (kv.slot, kv.stored, slot.owner, row.length) == (row, 0, None, 12)
    logits = [step({row.index: (ids[i], i)})[row.index] for i in range(12, 20)]
    kv.ran_tokens(ids[12:20])
    torch.testing.assert_close(torch.stack(logits), before[12:], rtol=1e-4, atol=1e-4)

    kv.sync()  # what the turn's end does: the row's positions go back to the session's cache
    assert kv.cache.get_seq_length() == 20 and kv.slot is None
    for layer, (keys, values) in zip(kv.cache.layers, batch.layers, strict=True):
        assert torch.equal(layer.keys[0], keys[row.index, :, :20])
        assert torch.equal(layer.values[0], values[row.index, :, :20])


def test_an_unknown_attention_variant_is_refused(tiny_model_dir):
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    with pytest.raises(ValueError, match="gqa, packed"):
        FastStep(model, fuse_weights(model), attention="flash")


@pytest.mark.parametrize("speculative", [False, True])
def test_chained_steps_give_the_single_step_replies_and_kv(engine, steps, speculative):
    shot = _shot(320, 240, 40)
    first = GenerationOptions(max_new_tokens=29, min_new_tokens=29)  # 28 after the first: not a multiple of 8
    second = GenerationOptions(max_new_tokens=11)
    steps(1, speculative)
    single = _conversation(engine, shot, first, second)
    steps(DECODE_STEPS, speculative)
    chained = _conversation(engine, shot, first, second)
    assert chained[:2] == single[:2]
    session = chained[2]
    assert session.last_stats.decode_tokens == len(session.context.ids) - session.last_stats.prompt_tokens
    assert len(session.cached.ids) == len(session.context.ids) - 1  # the KV never holds the last token


def test_an_end_token_inside_a_chain_ends_the_reply_there_and_min_new_tokens_holds_on_the_device(engine, steps):
    """Random weights never choose an end token, so one of the reply's own tokens is made one: the chain
    runs past it on the device, the host ends the reply at it, and the KV forgets the rest."""
    shot = _shot(320, 240, 41)
    opts = GenerationOptions(max_new_tokens=24)
    steps(1)
    session = engine.open_session([shot])
    session.complete("Go.", options=opts)
    reply = session.context.ids[session.last_stats.prompt_tokens :]
    end = next(t for i, t in enumerate(reply) if i >= 3 and t not in reply[:i])  # first seen mid-chain
    cut = reply.index(end)
    saved = engine.eos_ids, engine.eos_list
    engine.eos_ids, engine.eos_list = saved[0] | {end}, sorted(saved[0] | {end})
    try:
        results = {}
        for k in (1, DECODE_STEPS):
            steps(k)
            for floor in (0, cut + 3):  # an end token forbidden by min_new_tokens is never chosen
                s = engine.open_session([shot])
                text = s.complete("Go.", options=dataclasses.replace(opts, min_new_tokens=floor))
                after = s.complete("Next.", options=GenerationOptions(max_new_tokens=6))
                results[(k, floor)] = (text, after, list(s.context.ids), s.last_stats.cached_tokens)
                if floor == 0:
                    assert s.turns[0].reply == engine.tokenizer.decode(reply[:cut], skip_special_tokens=True)
        assert results[(DECODE_STEPS, 0)] == results[(1, 0)]
        assert results[(DECODE_STEPS, cut + 3)] == results[(1, cut + 3)]
        assert results[(1, cut + 3)][0] != results[(1, 0)][0]  # the floor really moved the end
    finally:
        engine.eos_ids, engine.eos_list = saved


def test_a_stop_string_inside_a_chain_shows_nothing_past_it(engine, steps):
    shot = _shot(320, 240, 42)
    steps(1)
    full = engine.open_session([shot]).complete("Go.", options=GenerationOptions(max_new_tokens=20))
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip() and full.index(stop) > 0
    opts = GenerationOptions(max_new_tokens=20, stop=(stop,))
    texts = {}
    for k in (1, DECODE_STEPS):
        steps(k)
        s = engine.open_session([shot])
        texts[k] = (s.complete("Go.", options=opts), s.complete("Then?", options=GenerationOptions(max_new_tokens=5)))
    assert texts[DECODE_STEPS] == texts[1]
    assert texts[1][0] == full[: full.index(stop)]


def test_a_cancel_during_chained_decoding_stops_within_one_chain_and_the_session_goes_on(engine, steps):
    steps(DECODE_STEPS)
    shot = _shot(320, 240, 43)
    session = engine.open_session([shot])
    stream = session.ask("Go on.", options=GenerationOptions(max_new_tokens=400, min_new_tokens=400))
    pieces = []
    with pytest.raises(GenerationCancelled):
        for piece in stream:
            pieces.append(piece)
            if len(pieces) == 2:
                session.cancel()  # mid-chain: the tokens of this chain are still being shown
    stats = session.last_stats
    assert stats.decode_tokens <= 1 + 2 * DECODE_STEPS  # the first token, the chain being shown, one more
    assert session.turns[-1].reply == "".join(pieces)
    assert len(session.cached.ids) == len(session.context.ids) - 1
    # The next turn reuses that KV, and each of its tokens is plain transformers' greedy choice over the
    # whole conversation (a KV holding anything past the cancelled reply would change them).
    follow = GenerationOptions(max_new_tokens=10, min_new_tokens=10)
    session.complete("Next?", options=follow)
    assert session.last_stats.cached_tokens > 0
    assert _teacher_forced_agrees(engine, session, follow)


@torch.inference_mode()
def _teacher_forced_agrees(engine, session, options) -> bool:
    ids, p = session.context.ids, session.last_stats.prompt_tokens
    k = len(ids) - p
    input_ids = torch.tensor([ids[: p + k - 1]])
    shots = [s for t in session.turns for s in t.images]
    ref = engine.processor.image_processor(images=[s.to_pil() for s in shots], return_tensors="pt")
    engine.model.model.rope_deltas = None
    logits = engine.model(
        input_ids=input_ids,
        pixel_values=ref["pixel_values"],
        image_grid_thw=ref["image_grid_thw"],
        mm_token_type_ids=(input_ids == engine.image_token_id).int(),
        logits_to_keep=k,
    ).logits[0]
    engine.model.model.rope_deltas = None
    logits[:, engine.banned_ids] = float("-inf")
    logits[: options.min_new_tokens, engine.eos_list] = float("-inf")
    return logits.argmax(-1).tolist() == ids[p:]
