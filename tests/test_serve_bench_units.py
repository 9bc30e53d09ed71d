"""The serving benchmark's arithmetic and the random models' tokenizer: a first token is timed on the
arrival of the first text, a reply without text is counted apart (never as a first token at its end),
and a tokenizer widened to a model's vocabulary gives every id text without changing any encoding."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from qvl_agent.devtools.tiny_model import _CORPUS, ADDED_TOKENS, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def serve_bench():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "scripts" / "serve_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_first_token_and_stream_rate_come_from_text_arrivals(serve_bench):
    reply = serve_bench.Reply(tokens=11, sent=10.0, arrivals=[10.2, 10.4, 10.7], done=11.5)
    assert reply.ttft == pytest.approx(0.2)
    assert reply.stream_rate == pytest.approx(10 / 0.5)  # first to last text, not to the end of the response
    assert not reply.textless and not reply.one_chunk


def test_a_reply_without_text_has_no_first_token_time(serve_bench):
    reply = serve_bench.Reply(tokens=256, sent=1.0, done=9.0)
    assert reply.textless and reply.ttft is None and reply.stream_rate is None


def test_a_reply_in_one_chunk_has_no_stream_rate(serve_bench):
    reply = serve_bench.Reply(tokens=256, sent=1.0, arrivals=[8.9], done=9.0)
    assert reply.one_chunk and reply.ttft == pytest.approx(7.9) and reply.stream_rate is None


def test_a_round_reports_textless_replies_instead_of_a_first_token_at_the_end(serve_bench, capsys):
    row = {
        "clients": 2, "requests": 2, "aggregate_tok_s": 100.0, "stream_tok_s_min": None, "stream_tok_s_p50": None,
        "ttft_ms_p50": None, "ttft_ms_p95": None, "follow_up_ttft_ms_p50": None, "slowest_reply_s": 3.0,
        "decode_batch_mean": 2.0, "lost": 0, "mixed": 0, "checked": 0, "textless": 2, "one_chunk": 0,
        "server_queue_ms_p50": None, "preprocess_ms_p50": None, "vision_ms_p50": None, "engine_ttft_ms_p50": None,
    }  # fmt: skip
    serve_bench.print_round("4", row)
    out = capsys.readouterr().out
    assert "first token p50 n/a" in out and "2 of 2 replies had tokens but no text" in out
    assert "by the server" not in out and "the batch thread" not in out  # a server that reports neither


def test_the_batch_threads_split_is_the_round_share_of_each_counter(serve_bench, capsys):
    before = {"qvl_batch_prefill_seconds_total": 1.0, "qvl_batch_decode_seconds_total": 2.0,
              "qvl_decode_batch_size_count": 100.0, "qvl_batch_ahead_steps_total": 50.0}  # fmt: skip
    after = {"qvl_batch_prefill_seconds_total": 3.0, "qvl_batch_decode_seconds_total": 5.0,
             "qvl_decode_batch_size_count": 400.0, "qvl_batch_ahead_steps_total": 290.0}  # fmt: skip
    split = serve_bench.batch_time(before, after, elapsed=10.0)
    assert split == {"batch_prefill_share": 0.2, "batch_decode_share": 0.3, "decode_step_ms_mean": 10.0,
                     "ahead_share": 0.8}  # fmt: skip
    assert serve_bench.batch_time({}, {}, 10.0) == {}  # a server without batching: nothing to split


def test_a_widened_tokenizer_gives_every_id_text_and_encodes_as_before():
    plain, wide = build_tokenizer(), build_tokenizer(total=4000)
    assert len(plain) < 4000 == len(wide)
    trained = len(plain) - len(ADDED_TOKENS)
    assert all(wide.decode([i], skip_special_tokens=True) for i in range(trained, 4000 - len(ADDED_TOKENS)))
    for line in _CORPUS.splitlines():  # the special and added tokens keep or move their ids, nothing else
        if not any(t in line for t in ADDED_TOKENS):
            assert wide.encode(line) == plain.encode(line)
    assert [wide.convert_tokens_to_ids(t) for t in ADDED_TOKENS] == list(range(4000 - len(ADDED_TOKENS), 4000))
