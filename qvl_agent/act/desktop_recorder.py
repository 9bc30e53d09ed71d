"""Recording what the person does on the desktop while they hold a run (take over, then hand back).

pynput's mouse and keyboard listeners hear every press on the X display (also xdotool's); each callback only
stamps a small event with the time it was heard and puts it on a queue, and one worker thread turns the events
into steps, grabbing the screen and writing the trace. The two listeners are two threads, so a click and the
key pressed right after it can reach the queue the other way round: the worker holds each event for
`REORDER_S` and takes them in the order of their stamps. A step has exactly the shape the agent writes for its
own desktop steps, with `"by": "person"`:

  - a mouse press is a click (`left_click`, `right_click`, `middle_click`) at the 0-1000 point of the pixel
    on the monitor under the pointer (the grab `run` makes); a second left press within `DOUBLE_S` and
    `DOUBLE_PX` makes it a `double_click` (a third a `triple_click`); a left press released more than
    `DRAG_PX` away is a `left_click_drag`;
  - printable characters typed in a row (Shift and AltGr make characters, not chords) are one `type` step;
    Backspace inside such a run takes its last character back;
  - a named key (Enter, Tab, Escape, arrows, F-keys) or a chord with Ctrl, Alt or Super is a `key` step,
    named as the model names keys (`keys.from_pynput`);
  - wheel clicks in a row at one place are one `scroll` (or `hscroll`) step, positive up (or right).

The screen is grabbed when a step starts (the click's press, a typing run's first key) and its picture written
with the step. A step is written when the next one starts, when a click's double-click time has passed, or at
`stop()`. The hotkeys of the project (stop, ask, region, take over) are not steps, nor are presses inside the
areas given to `keep_out` (the pause's own banner).

Private typing: while `mark_private(True)` (and for a typing run that starts while the focused widget is a
password field, where AT-SPI says so), the characters are kept in memory only: they become a secret
(`PASSWORD`, `PASSWORD_2`, ...) added to `secrets`, and the trace holds its placeholder `{{PASSWORD}}`.
Marking a run private while it is being typed makes the whole run private (it was not written yet), unless
the banner's own press ends that run next: the tick was that press's doing, heard first because a busy
listener thread stamped the press late, and what was typed before it is written as typed, as it would be had
the press been heard in time. Every record passes `secrets.mask` before it is written, so a value the run
already knows is masked too.
`typed` says, per type step, which parts are secrets, as the exporter takes it (`Secrets.segments`).

pynput is imported in `start()`: importing it without a display raises.
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from qvl_agent import actions as A
from qvl_agent import capture
from qvl_agent.act.keys import from_pynput, hotkey_chord
from qvl_agent.config import Hotkeys, every_hotkey, hotkey_keys
from qvl_agent.errors import CaptureError
from qvl_agent.image import GRID, Region, Screenshot, to_model
from qvl_agent.secrets import Secrets, placeholder
from qvl_agent.trace import TraceWriter

DOUBLE_S = 0.5  # a second press within this long of the first, at the same place, is a double click
DOUBLE_PX = 4
DRAG_PX = 8  # a left press released farther than this from where it went down is a drag
SCROLL_GAP_S = 0.6  # wheel clicks closer than this in time, at the same place, are one scroll
POLL_S = 0.05  # how often the worker looks whether a waiting click is done
REORDER_S = 0.25  # an event waits this long for one heard earlier on the other listener's thread (a busy machine)
READY_TIMEOUT_S = 5.0

MODIFIERS = ("ctrl", "alt", "shift", "win")  # in the order a chord names them
CHORD_MODIFIERS = frozenset({"ctrl", "alt", "win"})  # Shift and AltGr make characters, not chords
UNRECORDED_KEYS = frozenset({"capslock", "num_lock", "scroll_lock", "altgr"})  # they change what others type
ISO_LEFT_TAB = 0xFE20  # the keysym X gives Shift+Tab
BUTTONS = {"left": "left_click", "right": "right_click", "middle": "middle_click"}
MORE_CLICKS = {"left_click": "double_click", "double_click": "triple_click"}
CLICKS = {A.LeftClick, A.RightClick, A.MiddleClick, A.DoubleClick, A.TripleClick}


@dataclass
class _Event:
    kind: str  # press, release, scroll, key, keyup, private, stop
    t: float = 0.0
    x: int = 0
    y: int = 0
    button: str = ""
    dx: int = 0
    dy: int = 0
    name: str = ""  # a named key, canonical ("enter", "ctrl", "pagedown")
    char: str = ""  # a character key
    on: bool = False


@dataclass
class _Step:
    """A step being recorded: written once it cannot grow any more."""

    kind: str  # an action kind: left_click, double_click, left_click_drag, type, key, scroll, hscroll
    t: float
    shot: Screenshot | None
    pixels: list[list[int]] = field(default_factory=list)
    text: str = ""  # typed; only in memory until written (as a placeholder when private)
    keys: list[str] = field(default_factory=list)
    amount: int = 0  # wheel clicks
    private: bool = False
    marked: bool = False  # marked private while being typed (private unless the banner's press ends it next)
    button: str = ""  # the mouse button a click holds down until `released`
    released: bool = True


def default_hotkeys() -> list[str]:
    """The project's hotkeys at their defaults, the take-over hotkey's included."""
    return every_hotkey(Hotkeys())


def atspi_password_focused() -> bool:
    """Whether the focused widget is a password field, as AT-SPI says; False when pyatspi is not installed or
    the accessibility bus does not answer."""
    try:
        import pyatspi
    except Exception:  # not installed (or gi without Atspi): no detection, only marking
        return False
    try:

        def focused_password(node) -> bool:
            state = node.getState()
            return node.getRole() == pyatspi.ROLE_PASSWORD_TEXT and state.contains(pyatspi.STATE_FOCUSED)

        desktop = pyatspi.Registry.getDesktop(0)
        return any(pyatspi.findDescendant(app, focused_password) is not None for app in desktop if app is not None)
    except Exception:  # a dead application, a bus that went away
        return False


class DesktopRecorder:
    """Records the person's pointer and keys on the desktop into `trace` as steps `first_step`, `first_step
    + 1`, ... (see the module's docstring). `grab(monitor=N)` grabs a monitor (default `capture.grab`);
    `hotkeys` are pynput hotkeys that are not recorded (default `default_hotkeys()`).

    After `stop()`: `next_step` is the number the run goes on with, `secrets` holds the run's secrets and those
    typed privately, `typed` the exporter's segments per type step, `problems` events that could not be
    recorded (one sentence each)."""

    def __init__(
        self,
        trace: TraceWriter,
        secrets: Secrets,
        *,
        first_step: int,
        grab: Callable[..., Screenshot] | None = None,
        hotkeys: Iterable[str] | None = None,
    ):
        self.trace = trace
        self.secrets = secrets
        self.next_step = first_step
        self.typed: dict[tuple[int, int], list[list[str]]] = {}
        self.problems: list[str] = []
        self.password_focused: Callable[[], bool] = atspi_password_focused
        self._grab = grab or capture.grab
        self._ignored = {hotkey_chord(hotkey_keys(h)) for h in (default_hotkeys() if hotkeys is None else hotkeys)}
        self._events: queue.Queue[_Event] = queue.Queue()
        self._written: list[dict] = []
        self._pending: _Step | None = None
        self._held: set[str] = set()
        self._private = False
        self._pointer = (0, 0)
        self._kept_out: tuple[Region, ...] = ()
        self._monitors = []
        self._listeners: list = []
        self._listening = False  # callbacks that come after `stop()` (from threads still winding down) are dropped
        self._worker: threading.Thread | None = None

    # --- listening (pynput's threads) ---------------------------------------------------------------------

    def start(self) -> None:
        """Start listening; CaptureError (one sentence) when pynput cannot hear this display."""
        problem = capture.display_problem()
        if problem:
            raise CaptureError(problem)
        try:
            from pynput import keyboard, mouse  # imported here: importing pynput without a display raises

            self._pointer = tuple(int(v) for v in mouse.Controller().position)
        except Exception as exc:
            raise CaptureError(f"Cannot listen to the pointer and keyboard on this display: {exc}.") from None
        try:
            self._monitors = capture.list_monitors()
        except CaptureError:
            self._monitors = []  # the grab says why, step by step
        self._start_worker()
        named = {k: from_pynput(k.name) for k in keyboard.Key}
        self._listening = True

        def put(event: _Event) -> None:
            if self._listening:
                self._events.put(event)

        def on_press(key) -> None:
            put(_Event("key", time.monotonic(), **_key(key, named)))

        def on_release(key) -> None:
            put(_Event("keyup", time.monotonic(), **_key(key, named)))

        def on_click(x, y, button, pressed) -> None:
            put(_Event("press" if pressed else "release", time.monotonic(), x=int(x), y=int(y), button=button.name))

        def on_scroll(x, y, dx, dy) -> None:
            put(_Event("scroll", time.monotonic(), x=int(x), y=int(y), dx=int(dx), dy=int(dy)))

        try:
            for listener in (
                mouse.Listener(on_click=on_click, on_scroll=on_scroll),
                keyboard.Listener(on_press=on_press, on_release=on_release),
            ):
                self._listeners.append(listener)
                _start(listener)
        except RuntimeError as exc:
            self.stop()
            raise CaptureError(f"Cannot listen to the pointer and keyboard on this display: {exc}.") from None

    def mark_private(self, on: bool) -> None:
        """While on, typed text is kept out of the trace (a secret's placeholder stands there instead)."""
        self._events.put(_Event("private", time.monotonic(), on=bool(on)))

    def keep_out(self, areas: Iterable[Region]) -> None:
        """Presses and wheel clicks inside these desktop areas (the pause's banner) are no steps."""
        self._kept_out = tuple(areas)

    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._work, name="desktop-recorder", daemon=True)
        self._worker.start()

    def stop(self) -> list[dict]:
        """Stop listening, write the step being recorded, and return the step records written (as written)."""
        self._listening = False
        for listener in self._listeners:
            _stop(listener)
        self._listeners = []
        if self._worker is not None:
            self._events.put(_Event("stop"))
            self._worker.join()
            self._worker = None
        return list(self._written)

    # --- the worker ---------------------------------------------------------------------------------------

    def _work(self) -> None:
        held: list[tuple[float, int, _Event]] = []  # heard, not yet taken: (stamp, arrival, event), a heap
        arrival = itertools.count()
        while True:
            wait = POLL_S if not held else min(POLL_S, max(0.0, held[0][0] + REORDER_S - time.monotonic()))
            try:
                event = self._events.get(timeout=wait)
            except queue.Empty:
                event = None
            if event is not None and event.kind == "stop":
                while held:
                    self._take(heapq.heappop(held)[2])
                self._guarded(self._finish)
                return
            if event is not None:
                heapq.heappush(held, (event.t, next(arrival), event))
            ripe = time.monotonic() - REORDER_S
            while held and held[0][0] <= ripe:
                self._take(heapq.heappop(held)[2])
            if not held and event is None:
                self._guarded(self._idle)

    def _take(self, event: _Event) -> None:
        self._guarded(lambda: self._handle(event))

    def _guarded(self, work: Callable[[], None]) -> None:
        """An event that cannot be recorded is said once at the end; the recording goes on."""
        try:
            work()
        except Exception as exc:  # QvlError, OSError, or a surprise: one step lost, not the recording
            if len(self.problems) < 20:
                self.problems.append(f"A step could not be recorded: {exc}")

    def _idle(self) -> None:
        """Write a click once no second click can follow, and a scroll once the wheel rests."""
        step, now = self._pending, time.monotonic()
        if step is None or not step.released:
            return
        if step.kind in ("scroll", "hscroll") and now - step.t > SCROLL_GAP_S:
            self._finish()
        elif step.kind in BUTTONS.values() or step.kind in MORE_CLICKS.values():
            if step.kind == "triple_click" or now - step.t > DOUBLE_S:
                self._finish()

    def _handle(self, event: _Event) -> None:
        if event.kind in ("press", "release", "scroll"):
            self._pointer = (event.x, event.y)
        handler = {"press": self._press, "release": self._release, "scroll": self._scroll, "key": self._key,
                   "keyup": self._keyup, "private": self._mark}[event.kind]  # fmt: skip
        handler(event)

    def _mark(self, event: _Event) -> None:
        step = self._pending
        if event.on and step is not None and step.kind == "type":
            step.marked = True  # typed before the mark but not written yet: kept out as well
        elif not event.on and step is not None and step.kind == "type" and (step.private or step.marked):
            self._finish()
        self._private = event.on

    def _kept(self, event: _Event) -> bool:
        """A press on the banner: no step, but it ends a typing run (what follows may be marked private)."""
        if not any(area.contains(event.x, event.y) for area in self._kept_out):
            return False
        if self._pending is not None and self._pending.kind == "type":
            self._pending.marked = False  # a tick heard before this press was this press's doing
            self._finish()
        return True

    def _press(self, event: _Event) -> None:
        kind = BUTTONS.get(event.button)
        if kind is None or self._kept(event):
            return  # side buttons (no action of the model's format presses them), or the banner
        step = self._pending
        if (
            kind == "left_click"
            and step is not None
            and step.kind in MORE_CLICKS
            and step.released
            and event.t - step.t <= DOUBLE_S
            and _distance(step.pixels[0], (event.x, event.y)) <= DOUBLE_PX
        ):
            step.kind, step.t, step.released = MORE_CLICKS[step.kind], event.t, False
            return
        self._finish()
        shot = self._shoot(event.x, event.y)
        self._pending = _Step(kind, event.t, shot, [[event.x, event.y]], button=event.button, released=False)

    def _release(self, event: _Event) -> None:
        step = self._pending
        if step is None or step.released or step.button != event.button:
            return
        step.released = True
        if step.kind == "left_click" and _distance(step.pixels[0], (event.x, event.y)) > DRAG_PX:
            step.kind = "left_click_drag"
            step.pixels.append([event.x, event.y])
            self._finish()

    def _scroll(self, event: _Event) -> None:
        kind, amount = ("scroll", event.dy) if event.dy else ("hscroll", event.dx)
        if not amount or self._kept(event):
            return
        step = self._pending
        if (
            step is not None
            and step.kind == kind
            and (step.amount > 0) == (amount > 0)
            and event.t - step.t <= SCROLL_GAP_S
            and _distance(step.pixels[0], (event.x, event.y)) <= DRAG_PX
        ):
            step.amount, step.t = step.amount + amount, event.t
            return
        self._finish()
        self._pending = _Step(kind, event.t, self._shoot(event.x, event.y), [[event.x, event.y]], amount=amount)

    def _keyup(self, event: _Event) -> None:
        self._held.discard(event.name)

    def _key(self, event: _Event) -> None:
        name, char = event.name, event.char
        if name in MODIFIERS:
            self._held.add(name)
            return
        if name in UNRECORDED_KEYS or not (name or char):
            return
        chord = [m for m in MODIFIERS if m in self._held]
        step = self._pending
        if char and not CHORD_MODIFIERS & self._held:
            if char.isprintable():
                self._type(char, event.t)
            return
        if name == "backspace" and not chord and step is not None and step.kind == "type" and step.text:
            step.text = step.text[:-1]  # the field takes it back; the run types what was left
            return
        keys = [*chord, name or _chord_char(char)]
        if frozenset(keys) in self._ignored:
            return  # the take-over, stop, ask or region hotkey: no part of the task
        self._finish()
        self._pending = _Step("key", event.t, self._shoot(*self._pointer), keys=keys)
        self._finish()

    def _type(self, char: str, t: float) -> None:
        step = self._pending
        if step is None or step.kind != "type":
            self._finish()
            private = self._private or self._password_field()
            step = self._pending = _Step("type", t, self._shoot(*self._pointer), private=private)
        step.text += char
        step.t = t

    def _password_field(self) -> bool:
        try:
            return bool(self.password_focused())
        except Exception:  # optional: detection that fails is no detection
            return False

    def _shoot(self, x: int, y: int) -> Screenshot | None:
        """The monitor under (x, y), as `run` grabs it; None (a step without a picture) when it fails."""
        try:
            return self._grab(monitor=capture.monitor_at(x, y, self._monitors))
        except CaptureError as exc:
            if len(self.problems) < 20:
                self.problems.append(f"A step has no screenshot: {exc}")
            return None

    # --- writing a step -----------------------------------------------------------------------------------

    def _finish(self) -> None:
        step, self._pending = self._pending, None
        if step is None or (step.kind == "type" and not step.text):
            return
        n = self.next_step
        action, detail = self._action(step, n)
        result = {"action": A.describe(action) if action else _words(step), "ok": True,
                  "message": "done by the person", "detail": detail}  # fmt: skip
        if step.pixels:
            result["pixels"] = [list(p) for p in step.pixels]
        arguments = A.to_arguments(action) if action else {"action": step.kind}
        record = {"step": n, "by": "person", "reply": "", "actions": [arguments], "results": [result]}
        if step.shot is not None:
            record["screen"] = _screen(step.shot)
            record["screenshot"] = self.trace.screenshot(n, step.shot)
        record = self.secrets.mask(record)
        self.trace.step(record)
        self._written.append(record)
        self.next_step = n + 1

    def _action(self, step: _Step, n: int) -> tuple[A.Action | None, dict]:
        """The step as the model's action, and its result's detail (what the desktop executor puts there)."""
        if step.kind == "type":
            private = step.private or step.marked
            text = self._keep_private(step.text) if private else step.text
            self.typed[n, 0] = self.secrets.segments(self.secrets.mask(text))
            return A.Type(text), {"text": text, **({"private": True} if private else {})}
        if step.kind == "key":
            return A.Key(tuple(step.keys)), {"keys": list(step.keys)}
        points = [_grid(p, step.shot) for p in step.pixels]
        if any(p is None for p in points):
            return None, {"pixels": step.pixels}  # outside the grabbed monitor: the pixel is all there is
        x, y = points[-1]
        if step.kind == "left_click_drag":
            return A.LeftClickDrag(x, y, *points[0]), {"pixels": step.pixels}
        if step.kind in ("scroll", "hscroll"):
            cls = A.Scroll if step.kind == "scroll" else A.HScroll
            return cls(step.amount, x, y), {"clicks": step.amount, "pixels": step.pixels}
        return A.KINDS[step.kind](x, y), {"pixels": step.pixels}

    def _keep_private(self, text: str) -> str:
        """`text` as a secret (a known one, or PASSWORD, PASSWORD_2, ...), its placeholder returned."""
        values = dict(self.secrets.values)
        name = next((k for k, v in values.items() if v == text), "")
        if not name:
            name, count = "PASSWORD", 1
            while name in values:
                count += 1
                name = f"PASSWORD_{count}"
            self.secrets = Secrets({**values, name: text})
        return placeholder(name)


def _key(key, named: dict) -> dict:
    """A pynput key as an event's `name` (canonical) or `char`."""
    if key in named:
        name = named[key]
        return {"char": " "} if name == "space" else {"name": "altgr" if key.name == "alt_gr" else name}
    char, vk = getattr(key, "char", None), getattr(key, "vk", None)
    if char:
        return {"char": char}
    if vk == ISO_LEFT_TAB:
        return {"name": "tab"}
    return {}


def _chord_char(char: str) -> str:
    """A character pressed with Ctrl, Alt or Super, as a key name ("c" for Ctrl+C, also when X sends ^C)."""
    if len(char) == 1 and ord(char) < 32:
        return chr(ord(char) + 96)
    return "space" if char == " " else char.lower()


def _distance(a, b) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


def _grid(pixel, shot: Screenshot | None) -> tuple[int, int] | None:
    """A desktop pixel as the 0-1000 point the model would have written for it; None off the screenshot."""
    if shot is None or not shot.region.contains(*pixel):
        return None
    x, y = to_model(pixel[0], pixel[1], shot)
    return min(GRID, round(x)), min(GRID, round(y))


def _screen(shot: Screenshot) -> dict:
    return {"left": shot.left, "top": shot.top, "width": shot.width, "height": shot.height, "scale": shot.scale}


def _words(step: _Step) -> str:
    """A pointer step off the grabbed monitor, in words with its pixel."""
    px, py = step.pixels[-1]
    return f"{step.kind} at pixel ({px}, {py})"


def _start(listener) -> None:
    """Start a pynput listener and wait until it listens. pynput reports a failure only by its thread dying
    (its own `wait()` then blocks forever), so the thread is watched (as `guard.start_hotkeys` does)."""
    listener.daemon = True
    listener.start()
    waiter = threading.Thread(target=listener.wait, daemon=True)
    waiter.start()
    waiter.join(READY_TIMEOUT_S)
    if waiter.is_alive() or not listener.is_alive():
        raise RuntimeError(f"the listener did not start within {READY_TIMEOUT_S:g} s")


def _stop(listener) -> None:
    """Stop a pynput listener now. On X11 pynput's own `stop()` asks the server to end the recording on the
    connection that the listener's thread is blocked reading, so the request leaves only with the next key or
    pointer event; the same request sent on a connection of its own ends it at once (a recording context is
    the server's, not a connection's)."""
    listener.stop()
    context = getattr(listener, "_context", None)  # pynput's X11 listeners only
    if context is not None:
        try:
            from Xlib import display

            connection = display.Display()
            try:
                connection.record_disable_context(context)
                connection.sync()
            finally:
                connection.close()
        except Exception:  # the display is gone: so is the recording
            pass
    if listener is not threading.current_thread():
        listener.join(timeout=1.0)
