"""Continuous batching: the turns of many sessions decode together, one batched step per token.

One thread (`qvl-batch`) owns the model while any batched turn is in flight (it holds the engine's turn
lock meanwhile). Each pass of its loop:

1. admits waiting turns while a `BatchKV` row is free (FIFO; beyond the rows they wait in line);
2. runs one unit of prefill for the turn with the fewest prompt tokens left to prefill (the oldest of
   equals): its images (feature cache first), then the tokens its session's KV lacks, as one captured
   graph where a prefill bucket takes them (a GPU), else one chunk at a time. So a short request waits
   for one unit of a longer prompt, never for the whole of it; prompts alike are prefilled in the order
   they came, each to its first token before the next begins (taking turns would give every one of them
   its first token only once all were prefilled); and between units the decoding turns step, so a new
   request neither waits for others to finish nor stalls them for longer than one unit;
3. runs one batched decode step (`BatchStep`) for every decoding turn and hands each its token; while
   every turn picks greedily and nothing else waits, it goes on stepping, each step launched from the
   previous one's picks on the device before the host reads them (`_decode`).

Each turn keeps what a lone turn has: its own sampling parameters, stop strings, `max_new_tokens`,
cancellation (checked every step), and its session's KV reuse (the prefill runs on the session's own
cache or the engine's slot, the row is loaded from there and copied back to the cache at the end). A
turn's reply is exactly the one it would get alone: greedy picks come from the same logits.

A turn whose context and reply would not fit a row runs on the single-stream path instead; so does a
turn that arrives while nothing else is running (`LocalSession._generate`), which keeps a lone session
on the fastest path (compiled step, speculation, chained decoding). Whoever waits for the model outside
the batch (such a turn, a prefetch) gets it between two passes, so nothing starves behind a busy batch;
and a single-stream turn lets the batch run a pass between two of its tokens (`step_beside`), so the
batch never starves behind a long reply either.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator

import torch

from qvl_agent.engine.base import GenerationOptions, TurnStats
from qvl_agent.engine.batch_kv import ROW_TOKENS, BatchKV
from qvl_agent.engine.batch_step import BatchStep
from qvl_agent.engine.decode import TextStream, select_token
from qvl_agent.errors import EngineError, GenerationCancelled

# Prefill tokens per unit between two batched decode steps (~20 ms on an H200 for the 2B model).
PREFILL_CHUNK = {"cuda": 2048}
PREFILL_CHUNK_OTHER = 256


class _Turn:
    """One batched turn: what it was asked, where it is, what it has produced."""

    def __init__(self, session, options: GenerationOptions, target, shots):
        self.session, self.options, self.target, self.shots = session, options, target, shots
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # ("piece", str) / ("end", exc or None)
        self.finished = threading.Event()
        self.row = None
        self.prefill = None  # the prefill generator while it runs
        self.prefill_left = 0  # prompt tokens it has left to prefill: the turn with the fewest goes next
        self.start = time.perf_counter()
        self.generated: list[int] = []
        self.stream: TextStream | None = None
        self.pos0 = 0
        self.ttft: float | None = None
        self.decode_start = self.start
        self.prompt = (0.0, 0.0, False, 0)  # preprocess ms, vision ms, tower ran, reused tokens
        self.ended_with_eos = False
        self.accepted = 0  # drafted tokens verified before the turn joined the batch
        self.steps = 0
        self.batch_total = 0  # sum over its decode steps of how many turns decoded in that step
        self.batch_max = 1


class Batcher:
    def __init__(self, engine, rows: int, row_tokens: int = ROW_TOKENS):
        self.engine = engine
        self.kv = BatchKV(engine.model, rows, row_tokens, engine.device, engine.dtype)
        self.step = BatchStep(engine.model, self.kv, engine.step_weights)
        if engine.device.type == "cuda":
            self.step.capture()
        self.prefill_chunk = PREFILL_CHUNK.get(engine.device.type, PREFILL_CHUNK_OTHER)
        # The paths whose CUDA side only the GPU check proves (`fast_batch`); the CPU runs ahead always.
        self.prefill_as_graph = engine.settings.fast_batch
        self.run_ahead = engine.settings.fast_batch or engine.device.type != "cuda"
        self._waiting: deque[_Turn] = deque()
        self._active: list[_Turn] = []
        self._cond = threading.Condition()
        self._closed = False
        self._beside: set[str] = set()  # single-stream turns letting the batch run a pass (`step_beside`)
        self.batch_sizes: Counter[int] = Counter()  # decode steps by how many turns they carried
        self.tokens = 0  # tokens decoded in batched steps
        self.ahead_steps = 0  # steps launched from the previous step's picks before the host read them
        self.graph_prefills = 0  # prompts prefilled as one captured graph on the engine's slot
        # Where the batch thread's time goes (`serve`'s /metrics): seconds in prefill units (the GPU's
        # work included: a unit ends with a sync on a GPU) and in decode steps (launch to the picks).
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self._thread = threading.Thread(target=self._loop, name="qvl-batch", daemon=True)
        self._thread.start()

    # --- the callers' side ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        with self._cond:
            return bool(self._waiting or self._active)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def decoding(self) -> int:
        with self._cond:
            return len(self._active)

    @property
    def holds_model(self) -> bool:
        """Whether the batch thread holds the model (also for the moment after its last turn ended)."""
        return self.engine.lock.holder == self._thread.ident

    def active_sessions(self) -> set[str]:
        with self._cond:
            return {t.session.id for t in (*self._waiting, *self._active)} | self._beside

    def step_beside(self, session) -> None:
        """From a single-stream turn that holds the model between two of its tokens: let the batch run
        a pass, then take the model back. The turn goes on from its session's own cache (the shared
        single slot may change meanwhile); its KV is never dropped for memory while it waits."""
        e = self.engine
        session.kv.sync()
        if e.fast is not None and e.fast.slot.owner == session.id:
            e.fast.slot.owner = None
        with self._cond:
            self._beside.add(session.id)
        try:
            e.lock.let_waiters_in()
        finally:
            with self._cond:
                self._beside.discard(session.id)

    def fits(self, target, options: GenerationOptions) -> bool:
        """Whether the turn's context and longest reply fit one row."""
        return len(target.ids) + options.max_new_tokens + 1 <= self.kv.row_tokens - 1

    def run(self, session, text, images, options: GenerationOptions, target, shots) -> Iterator[str]:
        """Queue the turn and stream its pieces; sets `session.last_stats` at the end. Closing the
        stream early cancels the turn and waits until its KV is back in the session (within a step)."""
        turn = _Turn(session, options, target, shots)
        turn.prefill = self._prefill(turn)
        yield from self._follow(turn, first=False)

    def adopt(self, session, options, target, *, generated, stream, pos0, start, ttft, prompt, accepted):
        """Go on with a single-stream turn in the batch, from where it stopped: its KV (in the session's
        cache) holds the context and every generated token but the last, which runs next."""
        turn = _Turn(session, options, target, ())
        turn.generated, turn.stream, turn.pos0, turn.start, turn.ttft = generated, stream, pos0, start, ttft
        turn.prompt, turn.accepted = prompt, accepted
        turn.prefill = _nothing()  # nothing to prefill: the row is loaded from the session's cache
        yield from self._follow(turn, first=True)

    def _follow(self, turn: _Turn, first: bool) -> Iterator[str]:
        session = turn.session
        with self._cond:
            if self._closed:
                raise EngineError("The engine is shutting down.")
            if first:
                self._waiting.appendleft(turn)
            else:
                self._waiting.append(turn)
            self._cond.notify()
        try:
            while True:
                kind, value = turn.events.get()
                if kind == "piece":
                    yield value
                elif value is None:
                    return
                else:
                    raise value
        finally:
            if not turn.finished.is_set():
                session.cancel()
                with self._cond:
                    if turn in self._waiting:  # never admitted: nothing to put back
                        self._waiting.remove(turn)
                        turn.finished.set()
                turn.finished.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for turn in (*self._waiting, *self._active):
                turn.session.cancel()
            self._cond.notify()
        self._thread.join(10)

    # --- the batch thread -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._active or self._closed):
                    self._cond.wait()
                if self._closed and not (self._waiting or self._active):
                    return
            lock = self.engine.lock
            with lock, torch.inference_mode():
                while self._pass():
                    if lock.waiting:  # a turn that cannot join the batch (too long for a row, a prefetch)
                        break
                taken = lock.taken
            # Between two passes, whoever waits for the model gets it for its turn, then the batch goes
            # on: no turn waits for the batch to run dry, and the batch waits for one turn at most.
            lock.hand_over(taken)

    def _pass(self) -> bool:
        """One pass: admit, one prefill unit, one decode step. False once nothing is in flight."""
        with self._cond:
            while self._waiting and self.kv.free:
                turn = self._waiting.popleft()
                self._active.append(turn)
                self._admit(turn)
            active = list(self._active)
        if not active:
            return False
        for turn in active:
            if turn.session.cancelled or self._closed:
                self._end(turn, GenerationCancelled("The answer was stopped."))
        prefilling = [t for t in active if t.prefill is not None and not t.finished.is_set()]
        if prefilling:
            turn = min(prefilling, key=lambda t: t.prefill_left)  # the oldest of the fewest (min is stable)
            t0 = time.perf_counter()
            self._guard(turn, self._prefill_unit)
            if self.engine.device.type == "cuda":
                torch.cuda.synchronize(self.engine.device)  # the unit's GPU time is its own, not the step's
            self.prefill_seconds += time.perf_counter() - t0
            turn.prefill_left = len(turn.target.ids) - turn.session.kv.length
        decoding = [t for t in active if t.prefill is None and not t.finished.is_set()]
        if decoding:
            t0 = time.perf_counter()
            try:
                self._decode(decoding)
            except Exception as exc:  # the step failed for every row: each turn gets the error
                for turn in decoding:
                    self._end(turn, exc)
            self.decode_seconds += time.perf_counter() - t0
        return True

    def _guard(self, turn: _Turn, fn) -> None:
        try:
            fn(turn)
        except Exception as exc:
            self._end(turn, exc)

    def _admit(self, turn: _Turn) -> None:
        s, e = turn.session, self.engine
        turn.row = self.kv.take(s.id)
        # An adopted turn (mid-reply) has nothing to prefill: its row only loads.
        turn.prefill_left = 0 if turn.generated else len(turn.target.ids) - s.kv.reusable(turn.target)
        if e.fast is not None and e.fast.slot.owner == s.id:
            e.fast.slot.owner = None  # the session's KV now changes elsewhere: the single slot is stale

    def _prefill(self, turn: _Turn):
        """The turn's prompt, one unit per `next()`: images, then chunks of tokens. Returns the last
        position's logits."""
        s, e, target = turn.session, self.engine, turn.target
        reuse = s.kv.prepare(target)
        keyed = {e.image_entry(shot)[0]: shot for shot in turn.shots}
        fresh = [span for span in target.images if span.start >= reuse]
        feats, pre_ms, vis_ms, ran = e.encode_images([(keyed[span.key], span.key) for span in fresh])
        pre_ms, vis_ms, ran = s.take_prefetched(pre_ms, vis_ms, ran)
        turn.prompt = (pre_ms, vis_ms, ran, reuse)
        yield
        pos, next_pos = s._positions(target, reuse, bool(fresh))
        s.kv.next_pos = None
        # A prompt a captured bucket takes runs as one graph on the engine's slot (a lone turn's speed;
        # the row is loaded from the slot); anything else runs eagerly, a chunk per unit.
        logits = s._prefill_graph(target, reuse, fresh, feats, pos) if self.prefill_as_graph else None
        self.graph_prefills += logits is not None
        if logits is None:
            logits = yield from s._prefill_chunks(target, reuse, fresh, feats, pos, self.prefill_chunk)
        s.kv.next_pos = next_pos
        turn.pos0 = next_pos
        return logits

    def _prefill_unit(self, turn: _Turn) -> None:
        try:
            next(turn.prefill)
            return
        except StopIteration as done:
            logits = done.value
        turn.prefill = None
        s = turn.session
        s.kv.continue_on(turn.row)
        if turn.generated:  # adopted mid-reply: its next token is already chosen
            return
        turn.stream = TextStream(self.engine.tokenizer, turn.options.stop)
        turn.decode_start = time.perf_counter()
        self._accept(turn, s._choices(logits, 0, turn.options, turn.generated)[0])

    def _decode(self, turns: list[_Turn]) -> None:
        """Batched steps for `turns`, each turn then taking its next token: one step, or several in a row
        while every turn picks greedily and nobody else waits for the model. Then each next step is
        launched from the previous one's picks on the device before the host reads them, so the host's
        work for a token (its text, stop strings, streaming) runs while the device computes the next."""
        e = self.engine
        for t in turns:
            t.session.kv.check()
        logits = self.step({t.row.index: (t.generated[-1], t.pos0 + len(t.generated) - 1) for t in turns})
        for t in turns:
            t.session.kv.ran_tokens([t.generated[-1]])
        while True:
            logits.index_fill_(1, e.banned_ids, float("-inf"))
            forbid = [t.row.index for t in turns if len(t.generated) < t.options.min_new_tokens]
            if forbid:
                rows = torch.tensor(forbid, device=logits.device).view(-1, 1)
                logits[rows, torch.tensor(e.eos_list, device=logits.device).view(1, -1)] = float("-inf")
            picks = self.step.picks(logits, queued=self.run_ahead)
            ahead = self._can_run_ahead(turns)
            if ahead:  # the next step, fed the picks on the device; a turn that ends now gives its row back
                next_logits = self.step({t.row.index: (0, t.pos0 + len(t.generated)) for t in turns}, picks.device)
                for t in turns:
                    t.row.length -= 1  # until the host knows the turn goes on
                self.ahead_steps += 1
            self._take(turns, logits, picks.tolist())
            if not ahead:
                return
            turns = [t for t in turns if not t.finished.is_set()]
            for t in turns:
                t.row.length += 1  # the step already launched holds the token the turn just took
                t.session.kv.ran_tokens([t.generated[-1]])
            if not turns:
                return
            logits = next_logits

    def _can_run_ahead(self, turns: list[_Turn]) -> bool:
        """Whether the next step may start before the host reads this one's picks: every turn's next
        token is its greedy pick, and no turn waits to join, prefill, or take the model."""
        if not self.run_ahead or self._waiting or self.engine.lock.waiting or self._closed:
            return False
        for t in turns:
            o = t.options
            if o.temperature > 0 or len(t.generated) < len(o.force_ids) or t.session.cancelled:
                return False
        return not any(t.prefill is not None for t in self._active)

    def _take(self, turns: list[_Turn], logits: torch.Tensor, greedy: list[int]) -> None:
        """Each turn's next token from one step: forced, sampled from its row, or its greedy pick."""
        n = len(turns)
        self.batch_sizes[n] += 1
        self.tokens += n
        for t in turns:
            t.steps += 1
            t.batch_total += n
            t.batch_max = max(t.batch_max, n)
            o, index = t.options, len(t.generated)
            if index < len(o.force_ids):
                token = o.force_ids[index]
            elif o.temperature > 0:
                seen = torch.tensor(t.generated, device=logits.device, dtype=torch.long)
                row = logits[t.row.index : t.row.index + 1]
                sample = select_token(
                    row,
                    o.temperature,
                    o.top_p,
                    top_k=o.top_k,
                    presence_penalty=o.presence_penalty,
                    frequency_penalty=o.frequency_penalty,
                    seen=seen,
                )
                token = int(sample)
            else:
                token = greedy[t.row.index]
            self._accept(t, token)

    def _accept(self, turn: _Turn, token: int) -> None:
        """Add the turn's next token; end the turn at an end token, a stop string or the length limit."""
        e = self.engine
        turn.generated.append(token)
        if turn.ttft is None:
            turn.ttft = (time.perf_counter() - turn.start) * 1000
            turn.decode_start = time.perf_counter()
        if token in e.eos_ids:
            turn.ended_with_eos = True
            self._end(turn, None)
            return
        piece = turn.stream.push(token)
        if piece:
            turn.events.put(("piece", piece))
        if turn.stream.stopped or len(turn.generated) >= turn.options.max_new_tokens:
            self._end(turn, None)

    def _end(self, turn: _Turn, error: BaseException | None) -> None:
        """Put the turn's KV back in its session, record the turn, free the row, tell the reader."""
        if turn.finished.is_set():
            return
        s, e = turn.session, self.engine
        try:
            if turn.prefill is not None:
                turn.prefill.close()
                s.kv.sync()
            else:
                s._finish(turn.target, turn.pos0, turn.generated, turn.ended_with_eos)
                tail = turn.stream.flush() if error is None else ""
                if tail:
                    turn.events.put(("piece", tail))
        except Exception as exc:  # the KV is in an unknown state: drop it, the next turn rebuilds it
            s.drop_cache()
            error = error or exc
        if turn.row is not None and turn.row.owner == s.id:
            self.kv.give_back(turn.row)
        end = time.perf_counter()
        pre_ms, vis_ms, ran, reuse = turn.prompt
        n_decode = max(len(turn.generated) - 1, 0)
        s.last_stats = TurnStats(
            preprocess_ms=pre_ms,
            vision=("miss" if ran else "hit") if turn.target.images else "none",
            vision_ms=vis_ms,
            prefill_tokens=len(turn.target.ids) - reuse,
            ttft_ms=turn.ttft if turn.ttft is not None else (end - turn.start) * 1000,
            decode_tokens=len(turn.generated),
            decode_tokens_per_s=n_decode / (end - turn.decode_start) if n_decode else 0.0,
            total_ms=(end - turn.start) * 1000,
            prompt_tokens=len(turn.target.ids),
            cached_tokens=reuse,
            draft_accepted=turn.accepted,
            decode_path="batched",
            decode_batch=round(turn.batch_total / turn.steps, 2) if turn.steps else 1.0,
            decode_batch_max=turn.batch_max,
        )
        s.last_used = time.monotonic()
        with self._cond:
            if turn in self._active:
                self._active.remove(turn)
        e.enforce_memory_cap(keep=s)
        turn.finished.set()
        turn.events.put(("end", error))


def _nothing():
    """The prefill of a turn that has none."""
    yield from ()
