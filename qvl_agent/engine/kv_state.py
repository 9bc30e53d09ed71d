"""What a session's KV cache holds, kept in one object that checks itself; and the engine's turn lock.

A session's KV lives in its own transformers `DynamicCache`. During a turn on a GPU it runs ahead in the
engine's shared static slot (`cuda_graphs.KVSlot`), and the new positions are copied back at the end.
`SessionKV` is the one place that changes either, and after every change it checks:

- without a cache nothing is held; with one, the cache (or, while attached, the slot) holds exactly
  `len(held.ids)` positions and the cache exactly the `stored` positions not yet copied back;
- while attached, the slot belongs to this session (a session must never decode on another's KV).

A broken invariant is a bug in the engine: it raises `EngineError` instead of answering from wrong state.
"""

from __future__ import annotations

import threading

from qvl_agent.engine.context import Context, reusable_prefix
from qvl_agent.errors import EngineError


class TurnLock:
    """One turn at a time on the model. A turn holds it across its `yield`s, so a second turn from the
    thread that is still reading the first (interleaved streams) would otherwise run on the first's KV
    slot: that is refused with a clear error, while other threads simply wait their turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None
        self._turns = threading.Condition()  # guards the two counters below
        self.waiting = 0  # threads blocked on the lock now
        self.taken = 0  # times the lock was taken, ever

    def __enter__(self) -> TurnLock:
        if self._holder == threading.get_ident():
            raise EngineError("Another answer is still streaming on this thread; read it to the end or close it first.")
        with self._turns:
            self.waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._turns:
                self.waiting -= 1
                self.taken += 1
                self._turns.notify_all()
        self._holder = threading.get_ident()
        return self

    def hand_over(self, taken_before: int, timeout: float = 1.0) -> None:
        """After releasing: wait until another thread has taken the lock since `taken_before` (a plain
        lock would let the releasing thread take it straight back). Bounded, should the waiter be gone."""
        with self._turns:
            self._turns.wait_for(lambda: self.taken > taken_before or not self.waiting, timeout)

    def let_waiters_in(self) -> None:
        """From the turn holding the lock: let a thread waiting for it take its turn, then take it back."""
        taken = self.taken
        self.__exit__()
        try:
            self.hand_over(taken)
        finally:
            self.__enter__()

    def __exit__(self, *exc) -> None:
        self._holder = None
        self._lock.release()

    @property
    def busy(self) -> bool:
        """Whether a turn holds the model now."""
        return self._lock.locked()

    @property
    def holder(self) -> int | None:
        """The thread whose turn holds the model, if any."""
        return self._holder

    def held_here(self) -> bool:
        """Whether this thread's own turn holds the model."""
        return self._holder == threading.get_ident()


class SessionKV:
    def __init__(self, config, owner: str):
        self.config = config
        self.owner = owner
        self.cache = None  # transformers DynamicCache
        self.held = Context()  # the context whose KV the cache (or the attached slot) holds, token-exactly
        self.slot = None  # the KVSlot this turn runs on, when attached
        self.stored = 0  # positions of `held` already in `cache` while the slot runs ahead
        self.next_pos: int | None = None  # M-RoPE position of the first token after `held`, when known

    @property
    def length(self) -> int:
        return len(self.held.ids)

    def check(self) -> None:
        """Raise `EngineError` when the KV state is not what `held` says."""
        if self.cache is None:
            ok, what = not self.held.ids and self.slot is None, "KV held without a cache"
        elif self.slot is not None:
            what = "the KV slot belongs to another session"
            ok = self.slot.owner == self.owner
            if ok:
                what = f"slot holds {self.slot.length} positions, expected {self.length}"
                ok = self.slot.length == self.length and self.cache.get_seq_length() == self.stored
        else:
            what = f"cache holds {self.cache.get_seq_length()} positions, expected {self.length}"
            ok = self.cache.get_seq_length() == self.length
        if not ok:
            raise EngineError(f"Internal engine error: {what}.")

    def prepare(self, target: Context) -> int:
        """Keep the longest reusable prefix of `target` (a dropped cache is rebuilt empty); returns its
        length. Only the tokens after it need to run."""
        from transformers import DynamicCache

        self.check()
        reuse = self.reusable(target)
        if reuse == 0:
            self.cache = DynamicCache(config=self.config)
            self.held = Context()
            self.next_pos = None
        elif reuse < self.length:
            self.cache.crop(reuse - self.cache.get_seq_length())  # a negative count removes tokens
            self.held = _prefix(self.held, reuse)
            self.next_pos = None
        self.stored = reuse
        self.check()
        return reuse

    def reusable(self, target: Context) -> int:
        """How long a prefix of `target` `prepare` would keep; changes nothing."""
        return reusable_prefix(self.held, target) if self.cache is not None else 0

    def ran(self, target: Context, end: int) -> None:
        """The model's KV now holds `target.ids[:end]` (`held` was a prefix of it)."""
        self.held = _prefix(target, end)
        self.check()

    def ran_tokens(self, ids: list[int]) -> None:
        """The model's KV now also holds `ids` after `held` (generated or drafted tokens)."""
        self.held = Context(self.held.ids + ids, self.held.images, "")
        self.check()

    def attach(self, slot) -> None:
        """Continue on `slot`, which holds `held` for this session (loaded or kept from before)."""
        self.slot = slot
        self.stored = self.cache.get_seq_length()
        self.check()

    def continue_on(self, slot) -> None:
        """Copy everything this session's KV holds into `slot` (from the slot it runs on, else from the
        cache) and go on there. The slot it leaves no longer speaks for this session."""
        self.check()
        slot.load(self.slot.cache if self.slot is not None else self.cache, self.length, self.owner)
        if self.slot is not None:
            self.slot.owner = None
        else:
            self.stored = self.cache.get_seq_length()
        self.slot = slot
        self.check()

    def trim(self, n: int) -> None:
        """Forget positions from `n` on (rejected drafts, the last sampled token)."""
        if n >= self.length:
            return
        if self.slot is not None:
            if n < self.stored:
                raise EngineError("Internal engine error: trimming below the stored KV.")
            self.slot.set_length(n)
        else:
            self.cache.crop(n - self.cache.get_seq_length())
        self.held = _prefix(self.held, n)
        self.check()

    def sync(self) -> None:
        """Copy what the slot ran ahead back into the cache and detach (the slot stays owned, so the
        next turn of this session skips reloading it)."""
        if self.slot is None:
            return
        self.check()
        self.slot.store(self.cache, self.stored, self.slot.length)
        self.slot = None
        self.stored = self.cache.get_seq_length()
        self.check()

    def drop(self, slot=None) -> None:
        """Free the KV (the memory cap, or the session closing); the next turn rebuilds it."""
        if slot is not None and slot.owner == self.owner:
            slot.owner = None
        self.cache = None
        self.held = Context()
        self.slot = None
        self.stored = 0
        self.next_pos = None

    def bytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", None) or []:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None and hasattr(t, "element_size"):
                    total += t.numel() * t.element_size()
        return total


def _prefix(ctx: Context, n: int) -> Context:
    """The first `n` tokens of `ctx` with the images that lie wholly inside them."""
    return Context(ctx.ids[:n], [s for s in ctx.images if s.end <= n], "")
