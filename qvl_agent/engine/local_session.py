"""One conversation on the resident engine (`qwen3vl.Qwen3VLEngine`): build the turn's context, run the
tokens the KV cache lacks, decode.

- The prompt extends the previous turn token-exactly; only what the session's KV (`SessionKV`) lacks
  runs. A long prefill runs in chunks and checks the cancel flag between them, so a disconnected client
  frees the engine within one chunk.
- Greedy replies are decoded speculatively (unless `speculative` is off): drafts from the tool-call
  skeleton and prompt lookup (`speculate.py`) are verified in one multi-token forward and kept only where
  they equal the model's own greedy choice, so the reply is exactly plain greedy decoding.
- Where no draft is proposed, greedy decoding runs chains of `engine.decode_steps` steps, each fed the
  previous choice on the device, with one host sync per chain; end tokens, stop strings and the length
  limit are checked on the host afterwards and whatever a chain ran past them is trimmed from the KV.
- `prefetch(images)` encodes a screenshot and runs everything before the question while a person types.

The ids and the text of a finished turn always agree: the KV never holds the last sampled token (the
next turn runs it), and an end token the template never renders is recorded as the `<|im_end|>` it does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

import torch

from qvl_agent.engine.base import GenerationOptions, Session, TurnStats
from qvl_agent.engine.context import Context, ImageSpan, tokenize_with_images
from qvl_agent.engine.cuda_graphs import greedy_pick, text_forward
from qvl_agent.engine.decode import TextStream, select_token
from qvl_agent.engine.feature_cache import Features
from qvl_agent.engine.kv_state import SessionKV
from qvl_agent.engine.speculate import MAX_DRAFT, Drafter, accepted_count
from qvl_agent.errors import GenerationCancelled
from qvl_agent.image import Screenshot

QUESTION_MARK = "\x00question\x00"  # stands for the question when rendering what comes before it


class LocalSession(Session):
    def __init__(self, engine, images, system, tools):
        super().__init__(images, system, tools)
        self.engine = engine
        self.kv = SessionKV(engine.model.config, self.id)
        self.context = Context()  # the whole conversation so far (what the KV holds + the last sampled token)
        self.last_used = time.monotonic()
        self._prefetched = (0.0, 0.0, False)  # preprocess ms, vision ms, tower ran: told by the next turn

    @property
    def cached(self) -> Context:
        """The context whose KV the session holds."""
        return self.kv.held

    def kv_bytes(self) -> int:
        return self.kv.bytes()

    def drop_cache(self) -> None:
        self.kv.drop(self.engine.fast.slot if self.engine.fast else None)

    def close(self) -> None:
        self.drop_cache()
        self.context = Context()

    # --- the context ------------------------------------------------------------------------------------

    def _messages(self, text: str, images: tuple[Screenshot, ...]) -> tuple[list[dict], list[Screenshot]]:
        messages: list[dict] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        order: list[Screenshot] = []
        for turn in self.turns:
            messages.append(_user(turn.text, turn.images, self.text_first))
            order.extend(turn.images)
            messages.append({"role": "assistant", "content": [{"type": "text", "text": turn.reply}]})
        messages.append(_user(text, images, self.text_first))
        order.extend(images)
        return messages, order

    def _target(self, text: str, images: tuple[Screenshot, ...], upto_question: bool = False):
        """The context for this turn, extending the previous one token-exactly when possible; with
        `upto_question`, only what comes before the question's text."""
        e = self.engine
        messages, shots = self._messages(QUESTION_MARK if upto_question else text, images)
        rendered = e.render(messages, self.tools, add_generation_prompt=True)
        if upto_question:
            rendered = rendered[: rendered.index(QUESTION_MARK)]
        entries = [e.image_entry(s) for s in shots]
        prev = self.context
        if rendered.startswith(prev.text) and len(prev.images) <= len(entries):
            known = [im.key for im in prev.images]
            if known == [k for k, _, _ in entries[: len(known)]]:
                suffix = rendered[len(prev.text) :]
                new = entries[len(known) :]
                if suffix.count(e.image_token) == len(new):
                    ids, spans = tokenize_with_images(e.tokenizer, suffix, e.image_token, e.image_token_id, new)
                    return prev.extended(ids, spans, suffix), shots
        ids, spans = tokenize_with_images(e.tokenizer, rendered, e.image_token, e.image_token_id, entries)
        return Context(ids, spans, rendered), shots

    # --- running tokens ---------------------------------------------------------------------------------

    def _positions(self, target: Context, reuse: int, new_images: bool) -> tuple[torch.Tensor, int]:
        """M-RoPE positions `[3, 1, n]` of the tokens after `reuse`, and the position after them.

        A text-only continuation of everything the KV holds just counts on from where it stopped, with
        no device round trip; anything else is computed for the whole context."""
        e = self.engine
        n = len(target.ids) - reuse
        if not new_images and self.kv.next_pos is not None and reuse == self.kv.length:
            start = self.kv.next_pos
            pos = torch.arange(start, start + n, device=e.device).view(1, 1, n).expand(3, 1, n)
            return pos, start + n
        pos = e.positions(target)  # [3, 1, L]
        return pos[:, :, reuse:], int(pos.max()) + 1

    def _run_prompt(self, target: Context, shots, room: int):
        """Encode the new images and run every token of `target` the KV lacks. Returns (last logits
        `[1, V]`, position after the prompt, preprocess ms, vision ms, whether the tower ran, reused)."""
        e = self.engine
        reuse = self.kv.prepare(target)
        keyed = {e.image_entry(s)[0]: s for s in shots}
        fresh = [span for span in target.images if span.start >= reuse]
        feats, pre_ms, vis_ms, ran = e.encode_images([(keyed[span.key], span.key) for span in fresh])
        if self.cancelled:
            raise GenerationCancelled("The answer was stopped.")
        pos, next_pos = self._positions(target, reuse, bool(fresh))
        self.kv.next_pos = None
        logits = self._prefill(target, reuse, fresh, feats, pos, room)
        self.kv.next_pos = next_pos
        return logits, next_pos, pre_ms, vis_ms, ran, reuse

    def _prefill(self, target, reuse, fresh: list[ImageSpan], feats: list[Features], pos, room: int):
        """Run `target.ids[reuse:]`; the last position's logits `[1, V]`.

        On a GPU the tokens run as a captured graph on the shared KV slot whenever a bucket takes them;
        anything else runs eagerly in chunks on the session's own cache, then goes into the slot (if the
        reply fits) so that decoding still replays graphs."""
        fast = self.engine.fast
        if fast is None or len(target.ids) + room + MAX_DRAFT + 1 > fast.slot.max_len:
            if fast is not None and fast.slot.owner == self.id:
                fast.slot.owner = None  # the slot no longer matches this session's cache
            return self._prefill_eager(target, reuse, fresh, feats, pos)
        logits = self._prefill_graph(target, reuse, fresh, feats, pos)
        if logits is None:
            logits = self._prefill_eager(target, reuse, fresh, feats, pos)
            fast.slot.load(self.kv.cache, len(target.ids), self.id)
            self.kv.attach(fast.slot)
        return logits

    def _prefill_graph(self, target, reuse, fresh: list[ImageSpan], feats: list[Features], pos):
        """Run `target.ids[reuse:]` as one captured prefill graph on the engine's shared slot, where this
        session's KV then goes on; the last position's logits `[1, V]`. None, with nothing changed, when
        there are no graphs or no captured bucket takes that many tokens after `reuse`."""
        e, fast = self.engine, self.engine.fast
        if fast is None or fast.prefill_size(len(target.ids) - reuse, start=reuse) is None:
            return None
        slot = fast.slot
        if not (slot.owner == self.id and slot.length >= reuse):
            slot.load(self.kv.cache, reuse, self.id)
        slot.set_length(reuse)
        self.kv.attach(slot)
        ids = torch.tensor([target.ids[reuse:]], device=e.device)
        embeds, deepstack = e.embed(ids, [span.start - reuse for span in fresh], feats)
        logits = fast.run_prefill(embeds, pos, deepstack)
        self.kv.ran(target, len(target.ids))
        return logits

    def _prefill_eager(self, target, reuse, fresh, feats, pos):
        """Prefill on the session's own cache, `engine.prefill_chunk` tokens at a time, checking the
        cancel flag between chunks (what has run stays in the KV for the next turn)."""
        chunks = self._prefill_chunks(target, reuse, fresh, feats, pos, self.engine.prefill_chunk)
        while True:
            try:
                next(chunks)
            except StopIteration as done:
                return done.value

    def _prefill_chunks(self, target, reuse, fresh, feats, pos, chunk: int):
        """`_prefill_eager` as a generator that pauses between chunks (the batcher runs decode steps
        of other turns there); returns the last position's logits `[1, V]`."""
        e = self.engine
        ids = torch.tensor([target.ids[reuse:]], device=e.device)
        n = ids.shape[1]
        if n <= chunk:
            logits = e.forward(ids, pos, self.kv.cache, feats)
            self.kv.ran(target, len(target.ids))
            return logits
        embeds, deepstack = e.embed(ids, [span.start - reuse for span in fresh], feats)
        dense = []
        for index, values in deepstack:  # DeepStack as dense [1, n, H] tensors, sliced per chunk
            level = torch.zeros_like(embeds)
            level[0].index_copy_(0, index, values.to(level.dtype))
            dense.append(level)
        for c0 in range(0, n, chunk):
            if c0:
                yield
            if self.cancelled:
                raise GenerationCancelled("The answer was stopped.")
            c1 = min(n, c0 + chunk)
            hidden = text_forward(
                e.model, embeds[:, c0:c1], pos[:, :, c0:c1], self.kv.cache, [d[:, c0:c1] for d in dense]
            )
            self.kv.ran(target, reuse + c1)
        return e.model.lm_head(hidden[:, -1:])[:, -1]  # [1, V]

    def _run_tokens(self, ids: list[int], position: int) -> torch.Tensor:
        """Append `ids` (text tokens at positions from `position`) to the KV; their logits `[k, V]`."""
        e, k = self.engine, len(ids)
        self.kv.check()  # the slot's owner is checked before every step
        if self.kv.slot is not None:
            if k == 1:
                logits = e.fast.run_decode(ids[0], position)
            else:
                embeds = e.model.model.language_model.embed_tokens(torch.tensor([ids], device=e.device))
                pos = torch.arange(position, position + k, device=e.device).view(1, 1, k).expand(3, 1, k)
                logits = e.fast.run_prefill(embeds, pos, [], all_logits=True)
        else:
            pos = torch.arange(position, position + k, device=e.device).view(1, 1, k).expand(3, 1, k)
            logits = e.forward(torch.tensor([ids], device=e.device), pos, self.kv.cache, [], keep=k)
        self.kv.ran_tokens(ids)
        return logits

    def _chain_length(self, options: GenerationOptions, index: int, drafts: list[int]) -> int:
        """How many greedy steps the next forward may chain without the host (1: a plain step). Reply
        token `index` is the chain's first pick. Not for sampling, drafts, or forced ids, which the host
        decides; end tokens still forbidden by `min_new_tokens` are masked on the device."""
        k = min(self.engine.decode_steps, MAX_DRAFT + 1)  # the slot keeps room for that many (`_prefill`)
        if k < 2 or drafts or options.temperature > 0 or index < len(options.force_ids):
            return 1
        return k if options.max_new_tokens - index > 1 else 1

    def _run_chain(self, token: int, position: int, k: int, index: int, options: GenerationOptions) -> list[int]:
        """Append `token` at `position` and the greedy choices after it, k steps without a host sync;
        returns the k choices (reply tokens `index`..`index + k - 1`). The KV then holds `token` and the
        first k-1 choices: whatever follows an end token or a stop string is trimmed by the caller."""
        e = self.engine
        self.kv.check()
        forced = max(0, options.min_new_tokens - index)
        picks = e.fast.run_chain(token, position, k, forced) if self.kv.slot is not None else None
        if picks is None:  # no captured chain: the same steps one launch at a time, still one sync
            eos = torch.tensor(e.eos_list, device=e.device)
            current = torch.tensor(token, device=e.device)
            chosen = []
            for j in range(k):
                if self.kv.slot is not None:
                    logits = e.fast.run_decode(current, position + j)
                else:
                    pos = torch.full((3, 1, 1), position + j, device=e.device)
                    logits = e.forward(current.view(1, 1), pos, self.kv.cache, [], keep=1)
                current = greedy_pick(logits, e.banned_ids, eos, j < forced)[0]
                chosen.append(current)
            picks = torch.stack(chosen)
        out = picks.tolist()  # the one host sync per chain
        self.kv.ran_tokens([token, *out[:-1]])
        return out

    def _can_draft(self, options: GenerationOptions) -> bool:
        e = self.engine
        if not e.speculative or options.temperature > 0:
            return False
        return self.kv.slot is None or e.fast.prefill_size(MAX_DRAFT + 1) is not None

    def _choices(self, logits: torch.Tensor, index: int, options: GenerationOptions, generated) -> list[int]:
        """The token chosen after each row of `logits [k, V]`; row `j` picks reply token `index + j`."""
        e = self.engine
        logits.index_fill_(1, e.banned_ids, float("-inf"))
        forced = max(0, min(logits.shape[0], options.min_new_tokens - index))
        if forced:
            logits[:forced, e.eos_list] = float("-inf")
        if options.temperature > 0:
            seen = torch.tensor(generated, device=logits.device, dtype=torch.long)
            picks = [
                int(
                    select_token(
                        logits[:1],
                        options.temperature,
                        options.top_p,
                        top_k=options.top_k,
                        presence_penalty=options.presence_penalty,
                        frequency_penalty=options.frequency_penalty,
                        seen=seen,
                    )
                )
            ]
        else:
            picks = logits.argmax(dim=-1).tolist()  # the one host sync per forward: streaming needs it
        for j in range(len(picks)):
            if index + j < len(options.force_ids):
                picks[j] = options.force_ids[index + j]
        return picks

    # --- a turn -----------------------------------------------------------------------------------------

    def take_prefetched(self, pre_ms: float, vis_ms: float, ran: bool) -> tuple[float, float, bool]:
        """This turn's image work plus what a prefetch did for it (which belongs to this turn's stats)."""
        (p, v, r), self._prefetched = self._prefetched, (0.0, 0.0, False)
        return pre_ms + p, vis_ms + v, ran or r

    @torch.inference_mode()
    def _generate(self, text: str, images: tuple[Screenshot, ...], options: GenerationOptions) -> Iterator[str]:
        e = self.engine
        batcher = e.batcher
        if options.reply_prefix and not options.force_ids:  # every decode path honours forced tokens
            prefix = e.tokenizer.encode(options.reply_prefix, add_special_tokens=False)
            options = dataclasses.replace(options, force_ids=tuple(prefix))
        # Join the batch when the model is busy with other turns (a lone turn keeps the single-stream
        # path); never when this thread's own unfinished turn holds the model, which would wait for itself.
        # A batch thread that still holds the model after its last turn ended is about to let go.
        other_turn = e.lock.busy and not batcher.holds_model if batcher is not None else False
        if batcher is not None and not e.lock.held_here() and (batcher.busy or other_turn):
            target, shots = self._target(text, images)
            if batcher.fits(target, options):
                yield from batcher.run(self, text, images, options, target, shots)
                return
        with e.lock:
            start = time.perf_counter()
            self.last_used = time.monotonic()
            target, shots = self._target(text, images)
            try:
                logits, pos0, pre_ms, vis_ms, ran, reuse = self._run_prompt(target, shots, options.max_new_tokens)
            except BaseException:
                self.kv.sync()
                raise
            pre_ms, vis_ms, ran = self.take_prefetched(pre_ms, vis_ms, ran)
            stream = TextStream(e.tokenizer, options.stop)
            drafter = Drafter(target.ids, e.skeletons) if self._can_draft(options) else None
            generated: list[int] = []
            accepted = 0
            ttft = None
            ended_with_eos = False
            handed_over = False  # the rest of the reply decodes in the batch
            decode_start = time.perf_counter()
            try:
                chosen = self._choices(logits, 0, options, generated)
                m = 0  # how many of `chosen` are verified drafts (all but its last)
                while True:
                    done = False
                    for j, token_id in enumerate(chosen):
                        generated.append(token_id)
                        accepted += j < m  # only drafts that made it into the reply count
                        if ttft is None:
                            ttft = (time.perf_counter() - start) * 1000
                            decode_start = time.perf_counter()
                        if token_id in e.eos_ids:
                            ended_with_eos = done = True
                            break
                        piece = stream.push(token_id)
                        if piece:
                            yield piece
                        if stream.stopped or len(generated) >= options.max_new_tokens:
                            done = True
                            break
                    if done:
                        break
                    if self.cancelled:
                        raise GenerationCancelled("The answer was stopped.")
                    if batcher is not None and batcher.busy:
                        # Batched turns wait for the model: go on in the batch with them (the KV holds
                        # everything but the last token), or, too long for a row, let them run a pass
                        # between two of this reply's tokens; either way nobody waits for the whole reply.
                        if batcher.fits(target, options):
                            self.kv.sync()
                            handed_over = True
                            break
                        batcher.step_beside(self)
                    drafts = []
                    if drafter is not None:
                        drafter.extend(chosen)
                        drafts = drafter.propose(min(MAX_DRAFT, options.max_new_tokens - len(generated) - 1))
                    position = pos0 + len(generated) - 1
                    k = self._chain_length(options, len(generated), drafts)
                    if k > 1:
                        chosen, m = self._run_chain(generated[-1], position, k, len(generated), options), 0
                        continue
                    logits = self._run_tokens([generated[-1], *drafts], position)
                    picks = self._choices(logits, len(generated), options, generated)
                    m = accepted_count(drafts, picks)
                    self.kv.trim(len(target.ids) + len(generated) + m)  # rejected drafts leave the KV
                    chosen = drafts[:m] + [picks[m]]
                tail = "" if handed_over else stream.flush()
                if tail:
                    yield tail
            finally:
                if not handed_over:
                    self._finish(target, pos0, generated, ended_with_eos)
                end = time.perf_counter()
                n_decode = max(len(generated) - 1, 0)  # tokens after the first
                self.last_stats = TurnStats(
                    preprocess_ms=pre_ms,
                    vision=("miss" if ran else "hit") if target.images else "none",
                    vision_ms=vis_ms,
                    prefill_tokens=len(target.ids) - reuse,
                    ttft_ms=ttft if ttft is not None else (end - start) * 1000,
                    decode_tokens=len(generated),
                    decode_tokens_per_s=n_decode / (end - decode_start) if n_decode else 0.0,
                    total_ms=(end - start) * 1000,
                    prompt_tokens=len(target.ids),
                    cached_tokens=reuse,
                    draft_accepted=accepted,
                    decode_path=e.compile_status,
                )
                self.last_used = time.monotonic()
                if not handed_over:
                    e.enforce_memory_cap(keep=self)
        if handed_over:
            yield from batcher.adopt(
                self,
                options,
                target,
                generated=generated,
                stream=stream,
                pos0=pos0,
                start=start,
                ttft=ttft,
                prompt=(pre_ms, vis_ms, ran, reuse),
                accepted=accepted,
            )

    def _finish(self, target: Context, pos0: int, generated: list[int], ended_with_eos: bool) -> None:
        """Leave the KV holding the prompt and every generated token but the last, and record the turn
        with ids and text that agree."""
        e = self.engine
        ran = max(len(generated) - 1, 0)
        self.kv.trim(len(target.ids) + ran)
        self.kv.sync()
        self.kv.next_pos = pos0 + ran  # the position of the last generated token, which has not run
        body = generated[:-1] if ended_with_eos else generated
        tail = [e.im_end_id] if ended_with_eos else []
        self.context = Context(
            target.ids + body + tail,
            list(target.images),
            target.text + e.tokenizer.decode(body, skip_special_tokens=False) + (e.im_end if tail else ""),
        )

    @torch.inference_mode()
    def prefetch(self, images: Sequence[Screenshot] = ()) -> None:
        """Get the next question's context ready before the question exists: `images` (a screenshot
        just captured) are shown with the next `ask`, and they, plus everything before the question's
        text, are encoded and prefilled now. Then the question itself only prefills its own few tokens
        (Enter -> first token in ~10 ms on a GPU instead of a fresh screenshot's ~50-75 ms).

        Blocks while it runs (tens of ms on a GPU); callers that capture on a hotkey call it from a
        worker thread while the person types, then `ask` as usual, which waits for it if needed. A
        cancel, a failure or a different next question only cost the work; the answer is the same."""
        self.pending_images = self.pending_images + tuple(images)
        if self.text_first:
            return  # the images come after the question's text: nothing before it to get ready
        e = self.engine
        with e.lock:
            target, shots = self._target("", self.pending_images, upto_question=True)
            try:
                self._cancel.clear()
                _, _, pre_ms, vis_ms, ran, _ = self._run_prompt(target, shots, e.settings.max_new_tokens)
                self._prefetched = (pre_ms, vis_ms, ran)
            finally:
                self.kv.sync()
            e._sync()  # done means done: the question then waits for nothing


def _user(text: str, images: Sequence[Screenshot], text_first: bool = False) -> dict:
    content: list[dict] = [{"type": "image"} for _ in images]
    question = {"type": "text", "text": text}
    content = [question, *content] if text_first else [*content, question]
    return {"role": "user", "content": content}
