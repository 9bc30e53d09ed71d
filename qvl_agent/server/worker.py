"""Generation off the event loop: worker threads run the engine, fed through a bounded queue.

Engines are not thread-safe in general, so by default one worker thread makes every engine call
(opening sessions, `add_turn`, `ask`). The local engine with batching takes one worker per batch row:
their turns overlap and decode together in its batcher, which is the one place that touches the model.
HTTP handlers `submit` a `Job` and read its events — ("start", info),
("delta", text), ("done", result) or ("error", exception) — from an asyncio queue. When the queue of
waiting jobs is full, `reserve` refuses and the handler answers 429. A handler that gives up (client
gone, timeout) calls `job.cancel()`: a queued job is skipped, a running one stops at its next token.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from qvl_agent.engine.base import Engine, Session
from qvl_agent.engine.text_stream import TextStream
from qvl_agent.errors import GenerationCancelled
from qvl_agent.server.pool import SessionPool
from qvl_agent.server.protocol import ChatRequest


class Job:
    """One request's generation; events cross from the worker thread to the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Callable[[Job], None]):
        self.loop = loop
        self.work = work
        self.events: asyncio.Queue = asyncio.Queue()
        self.session: Session | None = None
        self.submitted = time.perf_counter()
        self._cancelled = threading.Event()

    def emit(self, kind: str, payload=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:
            pass  # the loop is gone (server shutting down): nobody is listening any more

    def cancel(self) -> None:
        """Stop this job: skipped if still queued, stopped at the next token if running. Any thread."""
        self._cancelled.set()
        session = self.session
        if session is not None:
            session.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Scheduler:
    """`workers` generation threads with at most `max_queue` jobs waiting behind the running ones."""

    def __init__(self, max_queue: int = 16, workers: int = 1):
        self.max_queue = max_queue
        self.workers = workers
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._avg_job_s = 1.0  # moving average, for Retry-After
        self._current: set[Job] = set()
        self._threads = [
            threading.Thread(target=self._loop, name=f"qvl-generation-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    def reserve(self) -> bool:
        """Take a place, or False when every worker is busy and `max_queue` jobs already wait. The place
        is held while the request's images are decoded, so at most `workers + max_queue` requests ever
        hold decoded images. A worker that is free counts as a place: a burst of requests fills every
        worker (every batch row) before the queue, however fast it arrives."""
        with self._lock:
            if self._waiting + self._running >= self.max_queue + self.workers:
                return False
            self._waiting += 1
            return True

    def release(self) -> None:
        """Give back a place taken with `reserve` that no job will use (the request failed first)."""
        with self._lock:
            self._waiting -= 1

    def submit(self, job: Job) -> None:
        """Queue the job in the place taken with `reserve`."""
        self._queue.put(job)

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: the queue's expected drain time, at least one."""
        return max(1, math.ceil(self._avg_job_s * (self._waiting + 1) / 2 / self.workers))

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._running += 1
                self._current.add(job)
            start = time.perf_counter()
            try:
                if job.cancelled:
                    job.emit("error", GenerationCancelled("The request was cancelled before it started."))
                else:
                    job.work(job)
            except BaseException as exc:  # every failure goes back to its request; the thread lives on
                job.emit("error", exc)
            finally:
                elapsed = time.perf_counter() - start
                with self._lock:
                    self._running -= 1
                    self._current.discard(job)
                    self._avg_job_s = 0.8 * self._avg_job_s + 0.2 * elapsed

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what is running and waiting, then stop the thread."""
        with self._lock:
            current = list(self._current)
        for job in current:
            job.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                with self._lock:
                    self._waiting -= 1
                job.cancel()
                job.emit("error", GenerationCancelled("The server is shutting down."))
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout)


class _PieceTokenizer:
    """Lets the engine's `TextStream` hold back stop strings over text pieces instead of token ids: each
    piece the engine streams is one "token" whose text is the piece itself."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def push(self, stream: TextStream, piece: str) -> str:
        self.pieces.append(piece)
        return stream.push(len(self.pieces) - 1)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


@dataclass(frozen=True)
class ChatResult:
    text: str
    finish_reason: str  # "stop" or "length"
    stats: dict  # TurnStats.as_dict() plus "vision" as the server reports it
    reused: bool
    queue_ms: float


def chat_work(engine: Engine, pool: SessionPool, request: ChatRequest) -> Callable[[Job], None]:
    """The worker-thread half of a chat completion: find or build the session, stream, re-pool."""

    def work(job: Job) -> None:
        queue_ms = (time.perf_counter() - job.submitted) * 1000
        # Each image under its scope's hash: the vision-feature cache and the pool keep scopes apart.
        history = [(t.text, [im.scoped(request.scope) for im in t.images], t.reply) for t in request.history]
        images = [im.scoped(request.scope) for im in request.images]
        session, reused = pool.checkout(
            engine, request.system, history, request.scope, request.tools, request.text_first
        )
        job.session = session
        job.emit("start", {"reused": reused})
        # The engine stops at stop strings itself; this guarantees the client never sees one whatever the
        # engine (remote servers differ), with the engine's own hold-back.
        tokens = _PieceTokenizer()
        stop = TextStream(tokens, request.stop)
        pieces: list[str] = []
        clean = False
        try:
            stream = session.ask(request.text, images, request.options)
            if job.cancelled:  # cancelled between checkout and ask: ask() started the turn afresh
                session.cancel()
            try:
                for piece in stream:
                    if job.cancelled:
                        raise GenerationCancelled("The client went away.")
                    out = tokens.push(stop, piece)
                    if out:
                        pieces.append(out)
                        job.emit("delta", out)
                    if stop.stopped:
                        break
            finally:
                stream.close()
            tail = stop.flush()
            if tail:
                pieces.append(tail)
                job.emit("delta", tail)
            stats = session.last_stats.as_dict() if session.last_stats else {}
            decoded = int(stats.get("decode_tokens", 0))
            finish = "length" if not stop.stopped and decoded >= request.options.max_new_tokens else "stop"
            stats["vision"] = _vision(stats.get("vision", "none"), reused, request)
            clean = not stop.stopped and session.last_stats is not None
            job.emit("done", ChatResult("".join(pieces), finish, stats, reused, queue_ms))
        finally:
            job.session = None
            if clean and not job.cancelled:
                pool.checkin(session, request.scope)
            else:
                session.close()  # its KV state may be mid-turn: never reuse it

    return work


def _vision(turn_vision: str, reused: bool, request: ChatRequest) -> str:
    """Whether the conversation's image features were computed for this request ("miss") or came from
    the feature cache or a reused session's KV cache ("hit"); "none" when it has no images."""
    if turn_vision in ("hit", "miss"):
        return turn_vision
    has_history_images = any(t.images for t in request.history)
    if has_history_images:
        return "hit" if reused else "miss"
    return "none"
