"""Batch rows sized to the memory: rows of 4,096 positions while `max_batch` of them fit the KV budget,
else shorter rows (down to 3,072: a 1080p screenshot's turn and a 512-token reply) so that more turns
decode together. On the CPU with the tiny model in fp32, turns in such rows reply token for token as
they do alone, and a turn too long for the shorter row runs alone, exactly too."""

from __future__ import annotations

import pytest

from qvl_agent.config import Settings
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.batch_kv import ROW_TOKENS, ROW_TOKENS_MIN, row_layout
from qvl_agent.engine.qwen3vl import Qwen3VLEngine
from tests.test_batching import Ask, Reader, _alone, _fixed, _shot, _together, model_busy

KIB, GIB = 2**10, 2**30
PER_TOKEN_2B = 112 * KIB  # the 2B model's K and V of one position, all layers, bf16


@pytest.mark.parametrize(
    "max_batch, memory, layout",
    [
        (16, 8 * GIB, (16, ROW_TOKENS)),  # 16 rows of 4,096 fit 8 GiB (7 GiB): as before
        (64, 8 * GIB, (24, ROW_TOKENS_MIN)),  # the 8 GB default at --max-batch 64: 18 rows of 4,096 become 24 of 3,072
        (64, 21 * GIB, (64, ROW_TOKENS_MIN)),  # 64 turns of a 1080p screenshot each
        (64, 24 * GIB, (64, 3328)),  # rows as long as 64 of them allow, in steps of 256
        (64, 28 * GIB, (64, ROW_TOKENS)),
        (4, 1 * GIB, (3, ROW_TOKENS_MIN)),  # 2 rows of 4,096 fit; 3 of 3,072 do
        (64, 300 * 2**20, (0, ROW_TOKENS_MIN)),  # not one row: batching stays off
        (1, 8 * GIB, (1, ROW_TOKENS)),
    ],
)
def test_rows_follow_the_memory_budget(max_batch, memory, layout):
    rows, row_tokens = row_layout(max_batch, memory, PER_TOKEN_2B)
    assert (rows, row_tokens) == layout
    assert rows * row_tokens * PER_TOKEN_2B <= memory


@pytest.fixture(scope="module")
def short_rows(tiny_model_dir):
    """4 rows where 4 rows of 4,096 positions do not fit: 7 MB holds 4 of 3,584 (512 bytes a position)."""
    e = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=Settings(max_batch=4, batch_memory_mb=7))
    assert (len(e.batcher.kv.rows), e.batcher.kv.row_tokens) == (4, 3584)
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    e = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=Settings(max_batch=1))
    yield e
    e.close()


def test_turns_in_shorter_rows_reply_exactly_as_alone(short_rows, alone):
    asks = [
        Ask(_shot(64 + 16 * i, 64 + 8 * i, 70 + i), f"Question {i}: what is here?", _fixed(8 + 5 * i)) for i in range(4)
    ]
    sessions = [a.open(short_rows) for a in asks]
    replies = _together(short_rows, sessions, asks)
    for ask, s, reply in zip(asks, sessions, replies, strict=True):
        assert ([reply], list(s.context.ids)) == _alone(alone, ask)
        assert s.last_stats.decode_path == "batched" and s.last_stats.decode_batch_max >= 2
    # A follow-up in the same rows goes on from each session's kept KV, exactly.
    follow = GenerationOptions(max_new_tokens=7, min_new_tokens=7)
    readers = [Reader(s, Ask(a.shot, "And then?", follow)) for s, a in zip(sessions, asks, strict=True)]
    with model_busy(short_rows, len(readers)):
        for r in readers:
            r.start()
    for ask, s, r in zip(asks, sessions, readers, strict=True):
        expected, ids = _alone(alone, ask, [("And then?", follow)])
        assert ([replies[asks.index(ask)], r.reply()], list(s.context.ids)) == (expected, ids)
        assert s.last_stats.cached_tokens > 0


def test_a_turn_that_fits_a_long_row_but_not_a_short_one_runs_alone_exactly(short_rows, alone):
    text = "Please describe everything " * 150  # a long prompt, so that few tokens need decoding
    s = short_rows.open_session([_shot(64, 64, 90)])
    prompt = len(s._target(text, tuple(s.pending_images))[0].ids)
    ask = Ask(s.pending_images[0], text, _fixed(3700 - prompt))
    assert short_rows.batcher.kv.row_tokens - 1 < prompt + ask.options.max_new_tokens + 1 < ROW_TOKENS - 1
    reply = s.complete(ask.text, options=ask.options)
    assert s.last_stats.decode_path != "batched"
    assert ([reply], list(s.context.ids)) == _alone(alone, ask)


def test_a_model_the_batched_step_does_not_compute_exactly_runs_without_batching_and_says_why(tiny_model_dir, tmp_path):
    """The batched step is the fused one (SiLU MLPs, no biases): for any other decoder layer it would give
    other numbers, so batching stays off, `serve` says why, and turns still answer alone."""
    import json
    import shutil

    from qvl_agent.commands.serve import batching_note

    model = tmp_path / "gelu-model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["text_config"]["hidden_act"] = "gelu_pytorch_tanh"
    (model / "config.json").write_text(json.dumps(config))
    e = Qwen3VLEngine.load(str(model), device="cpu", settings=Settings(max_batch=4))
    try:
        assert e.batcher is None
        assert "does not compute this model's layers exactly (activation gelu_pytorch_tanh)" in batching_note(e, 4)
        ask = Ask(_shot(64, 64, 90), "What is here?", _fixed(6))
        session = ask.open(e)
        session.complete(ask.text, options=ask.options)
        assert session.last_stats.decode_tokens == 6 and session.last_stats.decode_path != "batched"
    finally:
        e.close()


@pytest.mark.parametrize(
    "row_tokens, rows, end, shape",
    [
        (4096, 3, 2301, (4, 2560)),  # three 1080p turns read 2,560 positions a row, not 3,072
        (4096, 1, 100, (1, 2048)),
        (4096, 2, 4000, (2, 4096)),
        (3328, 5, 3100, (8, 3328)),  # a row length between two views: its own end is the last one
        (64, 2, 10, (2, 64)),
    ],
)
def test_a_batched_step_reads_each_row_only_up_to_the_view_past_the_longest(
    tiny_model_dir, row_tokens, rows, end, shape
):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from qvl_agent.engine.batch_kv import BatchKV
    from qvl_agent.engine.batch_step import BatchStep
    from qvl_agent.engine.fast_step import fuse_weights

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    step = BatchStep(model, BatchKV(model, 8, row_tokens, torch.device("cpu"), torch.float32), fuse_weights(model))
    assert step.shape_for(rows, end) == shape
