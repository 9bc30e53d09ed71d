"""Continuous batching with the tiny random Qwen3-VL on CPU: what a user of a busy server would notice.

Every reply is compared token for token with the same conversation run alone on an engine without
batching (`Settings(max_batch=1)`), and every test also checks that its turns really decoded in a shared
step (`decode_path == "batched"`, `decode_batch_max`, the batch's step log), so none passes on a path
that quietly runs turns one after another.

Turns are sequenced with events, never with sleeps: turns asked while the model is held (a test holding
`engine.lock` the way a running turn does, or a reader that pauses its single-stream reply) wait in the
batcher's line (`batcher.waiting`), and start together once it is released.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from qvl_agent.config import Settings
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.qwen3vl import Qwen3VLEngine
from qvl_agent.errors import EngineError, GenerationCancelled
from qvl_agent.image import Screenshot

TIMEOUT = 120  # seconds before a stuck turn fails the test instead of hanging it (never a speed check)
CALL = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [12, 34]}}\n'


def _shot(width: int, height: int, seed: int) -> Screenshot:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    alpha = np.zeros((height, width, 1), np.uint8)
    return Screenshot.from_array(np.concatenate([rgb[..., ::-1], alpha], -1), "BGRA")


def _fixed(n: int, **kw) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=n, min_new_tokens=n, **kw)


@dataclass(frozen=True)
class Ask:
    """One question of one conversation: its screenshot, text and options."""

    shot: Screenshot
    text: str
    options: GenerationOptions
    system: str | None = None

    def open(self, engine):
        return engine.open_session([self.shot], system=self.system)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu")
    assert e.batcher is not None and len(e.batcher.kv.rows) >= 8
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    """The reference: the same model with batching off, every turn on its own."""
    e = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=Settings(max_batch=1))
    assert e.batcher is None
    yield e
    e.close()


def _alone(alone, ask: Ask, follow_ups=()) -> tuple[list[str], list[int]]:
    """Replies and final context ids of the conversation `ask` (+ `(text, options)` follow-ups) alone."""
    s = ask.open(alone)
    replies = [s.complete(ask.text, options=ask.options)]
    replies += [s.complete(text, options=opts) for text, opts in follow_ups]
    return replies, list(s.context.ids)


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.002)


class Reader(threading.Thread):
    """One client: asks on its own thread and reads the reply to the end. With `pause_after`, it stops
    reading after that many pieces (`paused` is set) until `resume` is set, as a slow reader would."""

    def __init__(self, session, ask: Ask, pause_after: int | None = None):
        super().__init__(daemon=True)
        self.session, self.ask = session, ask
        self.pause_after = pause_after
        self.paused, self.resume = threading.Event(), threading.Event()
        self.pieces: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for piece in self.session.ask(self.ask.text, options=self.ask.options):
                self.pieces.append(piece)
                if len(self.pieces) == self.pause_after:
                    self.paused.set()
                    self.resume.wait(TIMEOUT)
        except BaseException as exc:  # the test thread looks at it
            self.error = exc
        finally:
            self.paused.set()

    def reply(self) -> str:
        self.join(TIMEOUT)
        assert not self.is_alive(), "the turn never ended"
        if self.error is not None:
            raise self.error
        return "".join(self.pieces)


@contextmanager
def model_busy(engine, expect: int):
    """Hold the model as a running turn does: turns asked inside queue for the batch; they start
    together once `expect` of them wait and the block ends."""
    with engine.lock:
        yield
        _wait_until(lambda: engine.batcher.waiting >= expect, f"{expect} turns waiting for the batch")


def _together(engine, sessions, asks) -> list[str]:
    """Ask every question at once, each from its own thread; their replies."""
    readers = [Reader(s, a) for s, a in zip(sessions, asks, strict=True)]
    with model_busy(engine, len(readers)):
        for r in readers:
            r.start()
    return [r.reply() for r in readers]


def _in_order(engine, readers: list[Reader]) -> list[str]:
    """Start the readers while the model is busy, each once the one before waits in the batcher's line,
    so they arrive in this order and start together; their replies."""
    with model_busy(engine, len(readers)):
        for n, r in enumerate(readers, start=1):
            r.start()
            _wait_until(lambda n=n: engine.batcher.waiting == n, "each arriving after the one before")
    return [r.reply() for r in readers]


class StepSpy:
    """Stands in for the batcher's step: tells `seen` the rows of each step, then runs the step itself."""

    def __init__(self, step, seen):
        self.step, self.seen = step, seen

    def __call__(self, tokens, picked=None):
        self.seen(tokens)
        return self.step(tokens, picked)

    def __getattr__(self, name):
        return getattr(self.step, name)


@contextmanager
def step_log(engine):
    """The sessions that decoded in each batched step, in order (`log[i]` is a set of session ids)."""
    batcher, log = engine.batcher, []
    step = batcher.step
    batcher.step = StepSpy(step, lambda tokens: log.append({batcher.kv.rows[r].owner for r in tokens}))
    try:
        yield log
    finally:
        batcher.step = step


@contextmanager
def long_turn(engine, seed: int):
    """A turn of another client that goes on until the block ends (then it is cancelled): the model
    is busy with it all along, so every turn asked meanwhile is batched with it."""
    s = engine.open_session([_shot(96, 64, seed)])
    reader = Reader(s, Ask(s.pending_images[0], "Keep going.", _fixed(3000)))
    reader.start()
    _wait_until(lambda: reader.pieces, "the long turn streaming")
    try:
        yield s
    finally:
        s.cancel()
        with pytest.raises(GenerationCancelled):
            reader.reply()
        _wait_until(lambda: not engine.lock.busy, "the model free again")


def _single_char_ids(engine, text: str) -> tuple[int, ...]:
    """Ids of `text`, one token per character (each decodes to its own character)."""
    ids = tuple(engine.tokenizer.convert_tokens_to_ids(c) for c in text)
    assert all(engine.tokenizer.decode([i]) == c for i, c in zip(ids, text, strict=True))
    return ids


# --- 1. equality ----------------------------------------------------------------------------------------


def test_concurrent_sessions_get_exactly_their_alone_replies(engine, alone):
    forced = tuple(engine.tokenizer.encode(CALL + "</tool_call>\nand then more words", add_special_tokens=False))
    asks = [
        Ask(_shot(64, 64, 1), "What is on the screen?", _fixed(6)),
        Ask(_shot(96, 80, 2), "Describe the window in detail.", _fixed(25)),
        Ask(_shot(128, 96, 3), "Where is the Save button?", GenerationOptions(max_new_tokens=14, min_new_tokens=3)),
        Ask(_shot(160, 120, 4), "Read the title.", GenerationOptions(max_new_tokens=18), system="Be brief."),
        Ask(
            _shot(120, 90, 5),
            "Click the OK button.",
            GenerationOptions(max_new_tokens=len(forced) + 10, force_ids=forced, stop=("</tool_call>",)),
            system="You control the computer.",
        ),
    ]
    sessions = [a.open(engine) for a in asks]
    before = Counter(engine.batcher.batch_sizes)
    replies = _together(engine, sessions, asks)
    for ask, session, reply in zip(asks, sessions, replies, strict=True):
        assert ([reply], list(session.context.ids)) == _alone(alone, ask)
        assert session.last_stats.decode_path == "batched"
    assert replies[-1] == CALL  # the tool call, cut at its stop string
    assert [s.last_stats.decode_tokens for s in sessions[:2]] == [6, 25]
    assert all(s.last_stats.decode_batch_max >= 2 for s in sessions)
    assert max((Counter(engine.batcher.batch_sizes) - before).keys()) >= 3


def test_greedy_steps_run_ahead_of_the_host_and_turns_ending_meanwhile_keep_exact_kv(engine, alone):
    """While every turn picks greedily and nothing else waits, each step starts from the previous step's
    picks on the device before the host has read them. A turn that ends meanwhile (its length, a stop
    string) has had one step too many run for it: its row gives that position back, so its reply, its
    context and its follow-up (which prefills on the KV the batch left) are exactly those alone."""
    probe = Ask(_shot(72, 72, 40), "Name three colours.", GenerationOptions(max_new_tokens=30))
    full = _alone(alone, probe)[0][0]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), f"the probe's reply has no text to stop at: {full!r}"
    asks = [
        Ask(_shot(72, 72, 40), "Name three colours.", GenerationOptions(max_new_tokens=30, stop=(stop,))),
        Ask(_shot(64, 96, 41), "What is open?", _fixed(7)),
        Ask(_shot(96, 64, 42), "Count the windows.", _fixed(40)),
    ]
    follow_up = ("And then?", _fixed(5))
    assert engine.batcher.run_ahead and not engine.batcher.prefill_as_graph  # a CPU runs ahead, fast_batch or not
    sessions = [a.open(engine) for a in asks]
    ahead = engine.batcher.ahead_steps
    replies = _together(engine, sessions, asks)
    assert engine.batcher.ahead_steps - ahead >= 30  # most steps ran ahead of the host
    assert stop not in replies[0] and sessions[0].last_stats.decode_tokens < 30  # cut at the stop string
    for ask, session, reply in zip(asks, sessions, replies, strict=True):
        assert session.last_stats.decode_path == "batched" and session.last_stats.decode_batch_max == 3
        follow = session.complete(follow_up[0], options=follow_up[1])
        assert ([reply, follow], list(session.context.ids)) == _alone(alone, ask, [follow_up])


# --- 2. staggered arrivals --------------------------------------------------------------------------------


def test_turns_that_arrive_while_a_long_reply_streams_join_it_and_all_stay_exact(engine, alone):
    first = Ask(_shot(96, 96, 10), "Tell me everything.", _fixed(80))
    later = [Ask(_shot(64, 80, 11), "Short?", _fixed(20)), Ask(_shot(80, 64, 12), "Other?", _fixed(30))]
    a = first.open(engine)
    lead = Reader(a, first, pause_after=3)  # a lone turn: it runs on the single-stream path
    lead.start()
    lead.paused.wait(TIMEOUT)
    assert engine.lock.busy and not engine.batcher.busy
    sessions = [x.open(engine) for x in later]
    readers = [Reader(s, x) for s, x in zip(sessions, later, strict=True)]
    for r in readers:
        r.start()
    _wait_until(lambda: engine.batcher.waiting == 2, "the later turns waiting")
    lead.resume.set()  # its next token sees them waiting: the rest of its reply goes on in the batch
    replies = [lead.reply(), *(r.reply() for r in readers)]
    assert ([replies[0]], list(a.context.ids)) == _alone(alone, first)
    for x, s, reply in zip(later, sessions, replies[1:], strict=True):
        assert ([reply], list(s.context.ids)) == _alone(alone, x)
    for s in (a, *sessions):
        assert s.last_stats.decode_path == "batched" and s.last_stats.decode_batch_max == 3
    assert a.last_stats.decode_tokens == 80


# --- 3. cancellation ------------------------------------------------------------------------------------


def test_a_cancelled_turn_stops_alone_and_its_session_goes_on_exactly(engine, alone):
    text = "abcdefghijklmnopqrstuvwxyz" * 10
    forced = _single_char_ids(engine, text)  # its pieces are exactly its tokens' text: the record is exact
    asks = [
        Ask(_shot(64, 64, 20), "First?", _fixed(40)),
        Ask(_shot(80, 80, 21), "Spell it.", GenerationOptions(max_new_tokens=len(forced), force_ids=forced)),
        Ask(_shot(96, 64, 22), "Third?", _fixed(50)),
    ]
    a, b, c = [x.open(engine) for x in asks]
    readers = [Reader(a, asks[0]), None, Reader(c, asks[2])]
    pieces: list[str] = []
    cancelled = threading.Event()

    def read_b():
        try:
            for piece in b.ask(asks[1].text, options=asks[1].options):
                pieces.append(piece)
                if len(pieces) == 10:
                    b.cancel()  # from the reader, as a client's stop button would
        except GenerationCancelled:
            cancelled.set()

    readers[1] = threading.Thread(target=read_b, daemon=True)
    with model_busy(engine, 3):
        for r in readers:
            r.start()
    readers[1].join(TIMEOUT)
    assert cancelled.is_set(), "the cancelled turn's stream did not raise GenerationCancelled"
    for r, x, s in ((readers[0], asks[0], a), (readers[2], asks[2], c)):
        assert ([r.reply()], list(s.context.ids)) == _alone(alone, x)
        assert s.last_stats.decode_batch_max == 3
    stats = b.last_stats
    assert stats.decode_path == "batched" and stats.decode_batch_max == 3
    generated = b.context.ids[stats.prompt_tokens :]
    assert 10 <= len(generated) < len(forced)
    assert b.turns[-1].reply == "".join(pieces) == text[: len(generated)]

    # The same conversation alone: the cut reply forced, then the follow-up decoded freely.
    ref = asks[1].open(alone)
    ref.complete(asks[1].text, options=GenerationOptions(max_new_tokens=len(generated), force_ids=tuple(generated)))
    assert (ref.turns, ref.context.ids) == (b.turns, b.context.ids)
    follow = GenerationOptions(max_new_tokens=15, min_new_tokens=15)
    assert b.complete("Go on.", options=follow) == ref.complete("Go on.", options=follow)
    assert b.context.ids == ref.context.ids
    assert b.last_stats.cached_tokens >= stats.prompt_tokens  # it went on from the KV the batch left


# --- 4. an abandoned stream -------------------------------------------------------------------------------


def test_a_reader_that_closes_its_stream_frees_its_row_and_others_are_unaffected(engine, alone):
    asks = [Ask(_shot(64, 64, 30), "One?", _fixed(40)), Ask(_shot(72, 64, 31), "Two?", _fixed(300))]
    asks.append(Ask(_shot(64, 72, 32), "Three?", _fixed(45)))
    a, b, c = [x.open(engine) for x in asks]
    rows = engine.batcher.kv.rows
    seen: dict = {}

    def read_b_then_leave():
        stream = b.ask(asks[1].text, options=asks[1].options)
        for n, _ in enumerate(stream, 1):
            if n == 10:
                seen["owned"] = any(r.owner == b.id for r in rows)
                stream.close()  # a client that hangs up mid-reply
                seen["after"] = any(r.owner == b.id for r in rows), b.id in engine.batcher.active_sessions()
                break

    readers = [Reader(a, asks[0]), threading.Thread(target=read_b_then_leave, daemon=True), Reader(c, asks[2])]
    with model_busy(engine, 3):
        for r in readers:
            r.start()
    readers[1].join(TIMEOUT)
    assert seen == {"owned": True, "after": (False, False)}  # the row is back as soon as close() returns
    for r, x, s in ((readers[0], asks[0], a), (readers[2], asks[2], c)):
        assert ([r.reply()], list(s.context.ids)) == _alone(alone, x)
        assert s.last_stats.decode_batch_max == 3
    assert b.last_stats.decode_path == "batched" and b.last_stats.decode_tokens < 300
    _wait_until(lambda: not engine.batcher.busy, "the batch emptied")
    assert engine.batcher.kv.free == len(rows)
    b.complete("Still there?", options=_fixed(5))  # the abandoned session still answers
    assert b.last_stats.cached_tokens > 0


# --- 5. a follow-up reuses its KV in the batch -------------------------------------------------------------


def test_a_follow_up_in_the_batch_prefills_only_its_own_tokens_and_matches_alone(engine, alone):
    ask = Ask(_shot(128, 96, 40), "What is this?", _fixed(12))
    follow_ups = [("And the button?", _fixed(10)), ("Anything else?", _fixed(8))]
    s = ask.open(engine)
    with long_turn(engine, 41) as other:
        replies = [s.complete(ask.text, options=ask.options)]
        first = s.last_stats
        replies.append(s.complete(follow_ups[0][0], options=follow_ups[0][1]))
        second = s.last_stats
        assert other.id in engine.batcher.active_sessions()  # the other turn decoded all along
    for stats in (first, second):
        assert stats.decode_path == "batched" and stats.decode_batch_max == 2
    # The whole first turn came from its KV (all but its last token, which the follow-up runs first).
    assert second.cached_tokens == first.prompt_tokens + first.decode_tokens - 1
    assert second.prefill_tokens + second.cached_tokens == second.prompt_tokens
    assert second.prefill_tokens < second.prompt_tokens / 4
    # Alone again: the KV the batch copied back to the session serves a third turn on the single path.
    replies.append(s.complete(follow_ups[1][0], options=follow_ups[1][1]))
    assert s.last_stats.decode_path != "batched"
    assert s.last_stats.cached_tokens == second.prompt_tokens + second.decode_tokens - 1
    assert (replies, list(s.context.ids)) == _alone(alone, ask, follow_ups)


# --- 6. a bounded number of rows -----------------------------------------------------------------------------


# 3 MB: two rows of 3,072 positions (1.5 MB each for the tiny model in fp32), the shortest rows there are.
@pytest.mark.parametrize("settings", [Settings(max_batch=2), Settings(batch_memory_mb=3)], ids=["rows", "memory"])
def test_more_turns_than_rows_wait_in_line_and_all_finish_exactly(tiny_model_dir, alone, settings):
    engine = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=settings)
    try:
        assert len(engine.batcher.kv.rows) == 2
        asks = [Ask(_shot(64 + 16 * i, 64, 50 + i), f"Question {i}?", _fixed(6 + 3 * i)) for i in range(5)]
        sessions = [a.open(engine) for a in asks]
        replies = _together(engine, sessions, asks)
        for ask, s, reply in zip(asks, sessions, replies, strict=True):
            assert ([reply], list(s.context.ids)) == _alone(alone, ask)
            assert s.last_stats.decode_path == "batched"
        assert max(engine.batcher.batch_sizes) == 2
        assert engine.batcher.kv.free == 2
    finally:
        engine.close()


# --- 7. fairness ---------------------------------------------------------------------------------------------


def test_a_short_turn_arriving_later_finishes_while_the_long_one_still_streams(engine, alone):
    long, short = Ask(_shot(96, 96, 60), "Write a lot.", _fixed(150)), Ask(_shot(64, 64, 61), "Yes?", _fixed(8))
    a, b = long.open(engine), short.open(engine)
    lead = Reader(a, long, pause_after=2)
    lead.start()
    lead.paused.wait(TIMEOUT)
    late = Reader(b, short)
    with step_log(engine) as log:
        late.start()
        _wait_until(lambda: engine.batcher.waiting == 1, "the short turn waiting")
        lead.resume.set()
        short_reply = late.reply()
        long_reply = lead.reply()
    assert [short_reply] == _alone(alone, short)[0] and [long_reply] == _alone(alone, long)[0]
    with_b = [i for i, owners in enumerate(log) if b.id in owners]
    with_a = [i for i, owners in enumerate(log) if a.id in owners]
    # The first token comes from the prefill, each later one from a shared step (7), and one more step ran
    # for it, launched from its last pick before the host had read that it was the last (run ahead).
    assert len(with_b) == 8
    assert all(a.id in log[i] for i in with_b)  # the long turn decoded in every step of the short one
    assert with_b[-1] < with_a[-1] - 100  # and went on long after the short one had finished


# --- 8. a long prompt is prefilled in chunks between decode steps ---------------------------------------------


def test_a_prompt_longer_than_a_chunk_is_prefilled_between_the_others_steps(engine, alone):
    long_prompt = Ask(_shot(96, 96, 70), "Read all of this: " + "word " * 120, _fixed(10))
    other = Ask(_shot(64, 64, 71), "Keep talking.", _fixed(120))
    a, b = other.open(engine), long_prompt.open(engine)
    passes: list[tuple[int, int]] = []  # (rows, tokens) of each prefill pass and batched step, in order
    layer = engine.model.model.language_model.layers[0].input_layernorm
    saved = engine.batcher.prefill_chunk
    engine.batcher.prefill_chunk = 16
    lead = Reader(a, other, pause_after=2)
    lead.start()
    lead.paused.wait(TIMEOUT)
    hook = layer.register_forward_pre_hook(lambda m, args: passes.append(tuple(args[0].shape[:2])))
    step = engine.batcher.step
    # The batched step runs the fused weights, not the layer's modules: it is logged where it is called.
    engine.batcher.step = StepSpy(step, lambda tokens: passes.append((len(tokens), 1)))
    try:
        late = Reader(b, long_prompt)
        late.start()
        _wait_until(lambda: engine.batcher.waiting == 1, "the long prompt waiting")
        lead.resume.set()
        replies = [late.reply(), lead.reply()]
    finally:
        hook.remove()
        engine.batcher.step = step
        engine.batcher.prefill_chunk = saved
    assert [replies[0]] == _alone(alone, long_prompt)[0] and [replies[1]] == _alone(alone, other)[0]
    stats = b.last_stats
    assert stats.decode_path == "batched" and stats.prefill_tokens > 10 * 16
    chunks = [i for i, (_, tokens) in enumerate(passes) if tokens > 1]  # (its last chunk is not 1 token)
    assert len(chunks) == -(-stats.prefill_tokens // 16)
    steps_between = sum(tokens == 1 for _, tokens in passes[chunks[0] : chunks[-1]])
    assert steps_between >= len(chunks) - 1  # the other turn decoded between every two chunks


def test_a_short_request_is_prefilled_between_the_chunks_of_longer_prompts_not_after_them(engine, alone):
    """Three long prompts arrive first, a four-word one last: prefills take turns, one unit each, so the
    short one's first token comes before any long prompt has finished its prefill; every reply is still
    exactly the one it gets alone."""
    longs = [Ask(_shot(64, 64, 80 + n), "Read all of this: " + "word " * 150, _fixed(4)) for n in range(3)]
    short = Ask(_shot(64, 64, 84), "Hi there, who?", _fixed(4))
    asks = [*longs, short]
    sessions = [a.open(engine) for a in asks]
    first_tokens: list[int] = []  # which ask's first piece came, in order
    saved = engine.batcher.prefill_chunk
    engine.batcher.prefill_chunk = 16
    readers = [Reader(s, a) for s, a in zip(sessions, asks, strict=True)]
    for n, reader in enumerate(readers):
        reader.pieces = _FirstLogged(first_tokens, n)
    try:
        replies = _in_order(engine, readers)
    finally:
        engine.batcher.prefill_chunk = saved
    assert first_tokens[0] == 3, first_tokens  # the short one, though it arrived last
    assert all(sessions[n].last_stats.prefill_tokens > 8 * 16 for n in range(3))  # the long ones: 8+ chunks
    for ask, reply in zip(asks, replies, strict=True):
        assert [reply] == _alone(alone, ask)[0]


def test_prompts_alike_get_their_first_tokens_in_the_order_they_came_not_all_at_the_end(engine, alone):
    """Three long prompts of the same size arrive together: the first is prefilled to its first token
    and streams while the others are prefilled, one after the other (taking turns would give all three
    their first token only once all were prefilled); every reply is exactly the one it gets alone."""
    asks = [Ask(_shot(64, 64, 90 + n), "Read all of this: " + "word " * 150, _fixed(n)) for n in (150, 30, 30)]
    sessions = [a.open(engine) for a in asks]
    saved = engine.batcher.prefill_chunk
    engine.batcher.prefill_chunk = 16
    readers = [Reader(s, a) for s, a in zip(sessions, asks, strict=True)]
    try:
        with step_log(engine) as log:
            replies = _in_order(engine, readers)
    finally:
        engine.batcher.prefill_chunk = saved
    first, second, third = (s.id for s in sessions)
    joined = [next(i for i, ids in enumerate(log) if s in ids) for s in (first, second, third)]
    assert joined[0] < joined[1] < joined[2], joined
    chunks = sessions[2].last_stats.prefill_tokens // 16
    # The first streamed all through the third's prefill: a step of its own between every two chunks.
    assert sum(first in ids for ids in log[joined[1] : joined[2]]) >= chunks, (joined, chunks)
    for ask, reply in zip(asks, replies, strict=True):
        assert [reply] == _alone(alone, ask)[0]


class _FirstLogged(list):
    """A reader's pieces that log the reader's number at its first piece."""

    def __init__(self, log: list[int], n: int):
        super().__init__()
        self.log, self.n = log, n

    def append(self, piece) -> None:
        if not self:
            self.log.append(self.n)
        super().append(piece)


# --- 9. sampling in a batch ------------------------------------------------------------------------------------


def test_a_sampled_turn_in_the_batch_leaves_the_greedy_turns_exact(engine, alone):
    shot = _shot(80, 80, 80)
    greedy = [Ask(shot, "Greedy one.", _fixed(20)), Ask(_shot(64, 96, 81), "Greedy two.", _fixed(24))]
    hot = Ask(shot, "Greedy one.", _fixed(20, temperature=2.0))
    nucleus_of_one = Ask(_shot(96, 64, 82), "Top only.", _fixed(16, temperature=1.0, top_p=0.0))
    asks = [greedy[0], hot, greedy[1], nucleus_of_one]
    sessions = [a.open(engine) for a in asks]
    replies = _together(engine, sessions, asks)
    for i in (0, 2):
        assert ([replies[i]], list(sessions[i].context.ids)) == _alone(alone, asks[i])
    # top_p = 0 keeps only the most likely token of its own row: the greedy reply.
    assert [replies[3]] == _alone(alone, replace(nucleus_of_one, options=_fixed(16)))[0]
    assert replies[1] != replies[0]  # the hot turn really sampled (same question, same screenshot)
    assert all(s.last_stats.decode_path == "batched" and s.last_stats.decode_batch_max == 4 for s in sessions)


# --- 10. one thread, two streams --------------------------------------------------------------------------------


def test_one_thread_reading_two_batched_streams_in_turn(engine, alone):
    asks = [Ask(_shot(64, 64, 90), "Left?", _fixed(60)), Ask(_shot(80, 64, 91), "Right?", _fixed(18))]
    a, b = [x.open(engine) for x in asks]
    with long_turn(engine, 92):
        live = {0: a.ask(asks[0].text, options=asks[0].options), 1: b.ask(asks[1].text, options=asks[1].options)}
        pieces: list[list[str]] = [[], []]
        while live:  # one piece from each in turn, as an app serving two sessions from one loop would
            for i in list(live):
                try:
                    pieces[i].append(next(live[i]))
                except StopIteration:
                    del live[i]
    for x, s, p in zip(asks, (a, b), pieces, strict=True):
        assert (["".join(p)], list(s.context.ids)) == _alone(alone, x)
    assert a.last_stats.decode_path == b.last_stats.decode_path == "batched"
    assert a.last_stats.decode_batch_max == b.last_stats.decode_batch_max == 3


def test_a_second_stream_on_the_thread_of_a_lone_turn_is_refused_clearly(engine, alone):
    """With nothing else running, the first stream is a lone turn holding the model on this thread:
    the second would wait for a turn that only this thread can move on, so it is refused, not hung."""
    asks = [Ask(_shot(64, 64, 93), "Left?", _fixed(25)), Ask(_shot(80, 64, 94), "Right?", _fixed(18))]
    a, b = [x.open(engine) for x in asks]
    first = a.ask(asks[0].text, options=asks[0].options)
    pieces = [next(first)]
    with pytest.raises(EngineError, match="still streaming"):
        next(b.ask(asks[1].text, options=asks[1].options))
    pieces += list(first)
    assert ["".join(pieces)] == _alone(alone, asks[0])[0]
    assert [b.complete(asks[1].text, options=asks[1].options)] == _alone(alone, asks[1])[0]


# --- 11. the GPU check's concurrent scenario runs here too -----------------------------------------------------


@pytest.mark.slow
def test_the_gpu_checks_concurrent_scenario_passes_on_cpu(tiny_model_dir, tmp_path):
    """`scripts/gpu_check.py --only concurrent` (staggered arrivals, a cancel, a follow-up while others
    decode; every batched reply against itself alone and the fp32 reference forward) keeps working."""
    out = tmp_path / "check.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    argv = ["--device", "cpu", "--model", str(tiny_model_dir), "--only", "concurrent", "--json", str(out)]
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(out.read_text())
    assert summary["mismatches"] == 0 and summary["problems"] == []
    batched = [row for row in summary["rows"] if "batched" in row["scenario"] or "while others" in row["scenario"]]
    assert len(batched) >= 6 and all(row["compared"] > 0 for row in batched)
    assert sum(n for size, n in summary["batch_sizes"].items() if int(size) > 1) > 0


def test_batch_rows_never_take_more_than_half_the_free_memory(tiny_model_dir, monkeypatch):
    """A tray on a small GPU gets fewer rows (or none) instead of running out of memory: the rows fit
    half of what is free after loading, whatever `max_batch` and `batch_memory_mb` allow."""
    from qvl_agent.engine import qwen3vl
    from qvl_agent.engine.batch_kv import ROW_TOKENS_MIN, BatchKV

    e = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=Settings(max_batch=1))
    per_row = BatchKV.bytes_per_row(e.model, ROW_TOKENS_MIN, e.dtype)  # the shortest rows there are
    try:
        monkeypatch.setattr(qwen3vl, "free_bytes", lambda device: 9 * per_row)
        e.start_batching(16, 8192)
        assert len(e.batcher.kv.rows) == 4  # 4.5 rows' worth is half of what is free
        assert e.batcher.kv.row_tokens == ROW_TOKENS_MIN
        e.batcher.close()
        e.batcher = None
        monkeypatch.setattr(qwen3vl, "free_bytes", lambda device: 3 * per_row)
        e.start_batching(16, 8192)
        assert e.batcher is None  # one row is no batch: turns stay on the single-stream path
        s = e.open_session([_shot(64, 64, 5)])
        assert s.complete("Still answers?", options=_fixed(4)) and s.last_stats.decode_path != "batched"
    finally:
        e.close()


# --- 12. a turn too long for a row does not starve behind a busy batch -----------------------------------------


def test_a_turn_too_long_for_a_row_runs_between_batch_steps_not_after_the_batch(engine, alone):
    """Its context does not fit a row, so it takes the single-stream path and waits for the model; the
    batch lets it in between two steps instead of making it wait until every batched turn is done."""
    too_long = Ask(_shot(64, 64, 100), "Read: " + "lorem ipsum dolor " * 320, _fixed(6))
    s = too_long.open(engine)
    with long_turn(engine, 101) as one:
        two = engine.open_session([_shot(80, 64, 102)])  # a second turn makes it a batch
        second = Reader(two, Ask(two.pending_images[0], "Go on.", _fixed(3000)))
        second.start()
        _wait_until(lambda: engine.batcher.decoding == 2, "two turns decoding in the batch")
        reply = s.complete(too_long.text, options=too_long.options)
        assert engine.batcher.active_sessions() == {one.id, two.id}  # both batched turns still stream
        two.cancel()
        with pytest.raises(GenerationCancelled):
            second.reply()
    assert s.last_stats.decode_path != "batched" and s.last_stats.prompt_tokens > engine.batcher.kv.row_tokens
    assert [reply] == _alone(alone, too_long)[0]
