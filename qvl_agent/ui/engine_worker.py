"""The resident engine on its own QThread: loaded once, every engine call made off the GUI thread.

`EngineHost` is the GUI-side handle. It owns a QThread and a worker object living on it; its methods only
queue work (through queued signals) and return at once, and the results come back as signals delivered in
the GUI thread: load progress and readiness, streamed answer pieces, the finished turn with its stats,
errors as one sentence. Cancelling a running answer calls `Session.cancel()`, which is safe from any thread.

A function handed to `call()` is only lent to the engine thread: the GUI thread keeps it until the result
is back, so its last reference always dies on the GUI thread. A closure that holds a window (the ask window's
own methods do) would otherwise free that window on the engine thread, and Qt crashes deleting a widget there.

One engine runs one thing at a time, so work queues behind a running answer or automation run.
This module does not know about windows; the tray app and the ask window use it.
"""

from __future__ import annotations

import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from qvl_agent.engine.base import Engine, GenerationOptions, Session
from qvl_agent.errors import GenerationCancelled, QvlError
from qvl_agent.image import Screenshot


@dataclass
class Conversation:
    """One ask window's conversation. The session is opened by the worker on the first question."""

    images: tuple[Screenshot, ...]
    system: str | None = None
    session: Session | None = None
    cancel_requested: bool = False
    turns: int = 0
    extra: dict = field(default_factory=dict)

    def cancel(self) -> None:
        """Stop the running answer (safe from any thread)."""
        self.cancel_requested = True
        if self.session is not None:
            self.session.cancel()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


class _Lent:
    """A function lent to the engine thread, which holds it only through a weak reference."""

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[[Engine], Any]) -> None:
        self.fn = fn


def _run_lent(lent: weakref.ref, engine: Engine | None) -> tuple[bool, Any]:
    """(True, what the function returned) or (False, one sentence). Every reference this frame took to the
    function, its traceback's included, is gone once it returns."""
    try:
        if engine is None:
            raise QvlError("The model is not loaded.")
        return True, lent().fn(engine)
    except QvlError as exc:
        return False, str(exc)
    except Exception as exc:
        traceback.print_exc()
        return False, f"{type(exc).__name__}: {exc}."


class _Worker(QObject):
    """Lives on the engine thread; every slot runs there."""

    loading = Signal(str)
    ready = Signal(str)
    failed = Signal(str)
    piece = Signal(int, str)
    answered = Signal(int, str, object)  # request id, whole reply, TurnStats | None
    errored = Signal(int, str)
    cancelled = Signal(int, str)  # request id, the part of the reply that arrived
    called = Signal(int, object)  # request id, return value of a call()
    call_failed = Signal(int, str)

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None

    @Slot(object)
    def load(self, factory: Callable[[], Engine]) -> None:
        self.loading.emit("Loading the model…")
        if self.engine is not None:  # a reload (new model or device): free the old one first
            self.engine.close()
            self.engine = None
        start = time.perf_counter()
        try:
            engine = factory()
        except QvlError as exc:
            self.failed.emit(str(exc))
            return
        except Exception as exc:  # a broken model directory can raise anything from transformers
            traceback.print_exc()
            self.failed.emit(f"The model could not be loaded: {exc}.")
            return
        self.engine = engine
        self.ready.emit(f"{engine.name} ready in {time.perf_counter() - start:.1f} s")

    @Slot(int, object, str, object)
    def ask(self, request: int, conv: Conversation, text: str, options: GenerationOptions | None) -> None:
        pieces: list[str] = []
        try:
            if self.engine is None:
                raise QvlError("The model is not loaded.")
            if conv.session is None:
                conv.session = self.engine.open_session(conv.images, system=conv.system)
            if conv.cancel_requested:
                raise GenerationCancelled("The answer was stopped.")
            conv.turns += 1
            for piece in conv.session.ask(text, options=options):
                pieces.append(piece)
                self.piece.emit(request, piece)
            self.answered.emit(request, "".join(pieces), conv.session.last_stats)
        except GenerationCancelled:
            self.cancelled.emit(request, "".join(pieces))
        except QvlError as exc:
            self.errored.emit(request, str(exc))
        except Exception as exc:
            traceback.print_exc()
            self.errored.emit(request, f"The model failed while answering: {exc}.")
        finally:
            conv.cancel_requested = False

    @Slot(int, object)
    def call(self, request: int, lent: weakref.ref) -> None:
        ok, value = _run_lent(lent, self.engine)
        (self.called if ok else self.call_failed).emit(request, value)

    @Slot()
    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


class EngineHost(QObject):
    """GUI-thread handle on the engine thread. Connect to the signals, then call `load()`."""

    loading = Signal(str)
    ready = Signal(str)
    failed = Signal(str)
    piece = Signal(int, str)
    answered = Signal(int, str, object)
    errored = Signal(int, str)
    cancelled = Signal(int, str)
    called = Signal(int, object)
    call_failed = Signal(int, str)

    _load = Signal(object)
    _ask = Signal(int, object, str, object)
    _call = Signal(int, object)
    _shutdown = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = "idle"  # idle | loading | ready | failed
        self.message = ""
        self._next = 0
        self._thread = QThread()
        self._thread.setObjectName("qvl-engine")
        self._worker = _Worker()
        self._worker.moveToThread(self._thread)
        self._lent: dict[int, _Lent] = {}  # calls running or queued, held here until their result is back
        for name in ("piece", "answered", "errored", "cancelled"):
            getattr(self._worker, name).connect(getattr(self, name))
        self._worker.called.connect(self._on_called)
        self._worker.call_failed.connect(self._on_call_failed)
        self._worker.loading.connect(self._on_loading)
        self._worker.ready.connect(self._on_ready)
        self._worker.failed.connect(self._on_failed)
        self._load.connect(self._worker.load)
        self._ask.connect(self._worker.ask)
        self._call.connect(self._worker.call)
        self._shutdown.connect(self._worker.shutdown)
        self._thread.start()

    @property
    def is_ready(self) -> bool:
        return self.state == "ready"

    def load(self, factory: Callable[[], Engine]) -> None:
        """Build the engine on the engine thread; `ready` or `failed` follows."""
        self.state = "loading"
        self.message = "Loading the model…"
        self._load.emit(factory)

    def ask(self, conv: Conversation, text: str, options: GenerationOptions | None = None) -> int:
        """Queue a question; returns the request id that the result signals carry."""
        self._next += 1
        conv.cancel_requested = False
        self._ask.emit(self._next, conv, text, options)
        return self._next

    def call(self, fn: Callable[[Engine], Any]) -> int:
        """Run `fn(engine)` on the engine thread (automation runs, script generation)."""
        self._next += 1
        self._lent[self._next] = lent = _Lent(fn)
        self._call.emit(self._next, weakref.ref(lent))
        return self._next

    def close(self, timeout_ms: int = 5000) -> None:
        """Release the engine and end the thread (waits for a running turn to notice a cancel)."""
        if not self._thread.isRunning():
            return
        self._shutdown.emit()
        self._thread.quit()
        self._thread.wait(timeout_ms)

    @Slot(int, object)
    def _on_called(self, request: int, value: Any) -> None:
        self.called.emit(request, value)
        del self._lent[request]  # the function's last reference, dropped on this (the GUI) thread

    @Slot(int, str)
    def _on_call_failed(self, request: int, message: str) -> None:
        self.call_failed.emit(request, message)
        del self._lent[request]

    @Slot(str)
    def _on_loading(self, message: str) -> None:
        self.state, self.message = "loading", message
        self.loading.emit(message)

    @Slot(str)
    def _on_ready(self, message: str) -> None:
        self.state, self.message = "ready", message
        self.ready.emit(message)

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        self.state, self.message = "failed", message
        self.failed.emit(message)
