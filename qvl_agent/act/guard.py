"""The safety guard between the model's actions and the executor.

Every action passes `Guard.check(action, shot)` right before it runs, so the checks hold between the
actions of one reply as well as between steps:

* the emergency stop (a `StopSwitch`, set by the stop hotkey through pynput or by `stop()` from any
  thread) halts the run: `check` raises `EmergencyStop`, `sleep` wakes at once, and callbacks registered
  with `StopSwitch.on_stop` (the agent registers the engine session's `cancel`) run on the spot;
* confinement: a point outside the allowed monitor or region raises `OffScreenError` (the model is told);
* modes: `confirm` shows the action with its pixel coordinates and asks yes/no (a "no" stops the run;
  the terminal prompt polls the stop switch, so the hotkey ends it without waiting for Enter),
  `auto` runs without asking, `dry-run` is carried by the dry-run executor (the guard still checks);
* system key combinations (`keys.system_chord`: log out, lock, console switch, the stop hotkey itself)
  are asked about even in `auto` mode unless `allow_keys`; a "no" there goes back to the model;
* limits: at most `max_actions_per_reply` actions in one reply and `max_type_chars` characters in one
  `type`; beyond them nothing runs and the model is told (`ActionError`).

pynput is imported only when the hotkey listener starts, because importing it without a display raises.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections.abc import Callable

from qvl_agent import actions as A
from qvl_agent.act.keys import hotkey_chord, system_chord
from qvl_agent.config import Settings, hotkey_keys, hotkey_label
from qvl_agent.errors import ActionError, ConfigError, EmergencyStop, OffScreenError
from qvl_agent.image import Region, Screenshot, to_pixels

MODES = ("confirm", "auto", "dry-run")
DEFAULT_STOP_HOTKEY = "<ctrl>+<alt>+<esc>"

Pixels = list[tuple[int, int]]
Confirm = Callable[[A.Action, Pixels, Screenshot], bool]


class StopSwitch:
    """A thread-safe emergency stop: set once by a hotkey, a button or code; checked everywhere."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason = ""

    def stop(self, reason: str = "The emergency stop was pressed.") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a failing callback must not keep the stop from reaching the rest
                pass

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the switch is set (at once if it already is); returns an unregister."""
        with self._lock:
            self._callbacks.append(callback)
            already = self._event.is_set()
        if already:
            callback()

        def remove() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise EmergencyStop(self.reason)

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake the moment the switch is set and raise EmergencyStop."""
        if self._event.wait(max(0.0, seconds)):
            raise EmergencyStop(self.reason)

    def reset(self) -> None:
        with self._lock:
            self._event.clear()
            self.reason = ""


READY_TIMEOUT_S = 5.0  # pynput's listener is live within milliseconds; past this it never will be


def start_hotkeys(mapping: dict[str, Callable[[], None]]):
    """A started pynput `GlobalHotKeys` for `mapping` ({"<ctrl>+<alt>+<esc>": callback}), listening once
    this returns. RuntimeError with a readable reason when global hotkeys cannot work here: no display or
    backend, an X server without the RECORD extension, a hotkey pynput cannot parse. pynput reports a
    failure only by its thread dying (its own `wait()` then blocks forever), so the thread is watched."""
    try:
        from pynput import keyboard  # imported here: importing pynput without a display raises

        listener = keyboard.GlobalHotKeys(mapping)
    except ValueError as exc:
        raise RuntimeError(f"a hotkey cannot be used ({exc})") from None
    except Exception as exc:  # ImportError, or Xlib's errors without a display
        raise RuntimeError(f"global hotkeys are not available here ({exc})") from None
    failure: list[Exception] = []
    run = listener.run

    def run_and_catch() -> None:
        try:
            run()
        except Exception as exc:  # kept for the message instead of a traceback on stderr
            failure.append(exc)

    listener.run = run_and_catch
    listener.daemon = True
    listener.start()
    waiter = threading.Thread(target=listener.wait, daemon=True)
    waiter.start()
    waiter.join(READY_TIMEOUT_S)
    if waiter.is_alive() or failure:  # no listener.stop(): it too waits for a ready that never comes
        why = str(failure[0]) if failure else f"the listener did not start within {READY_TIMEOUT_S:g} s"
        if "record" in why.lower():
            why = "the X server has no RECORD extension"
        raise RuntimeError(f"global hotkeys are not available here ({why})")
    return listener


class HotkeyListener:
    """A global hotkey (pynput GlobalHotKeys syntax, e.g. "<ctrl>+<alt>+<esc>") that sets a StopSwitch."""

    def __init__(self, hotkey: str, switch: StopSwitch):
        self.hotkey = hotkey
        self.switch = switch
        self._listener = None

    def start(self) -> None:
        """Start listening; raises RuntimeError with a readable reason when global hotkeys are unavailable."""
        message = f"The emergency stop hotkey {hotkey_label(self.hotkey)} was pressed."
        self._listener = start_hotkeys({self.hotkey: lambda: self.switch.stop(message)})

    def close(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener.join(timeout=1.0)  # let it close its display connections before we go
            self._listener = None


def describe_pixels(action: A.Action, pixels: Pixels) -> str:
    text = A.describe(action)
    if pixels:
        text += " -> pixel " + " -> ".join(f"({x}, {y})" for x, y in pixels)
    return text


POLL_S = 0.1  # how often a waiting y/N prompt looks at the stop switch
_pending: dict[int, bytes] = {}  # bytes read past a prompt's line (piped answers), per file descriptor


def read_line(stream, switch: StopSwitch | None) -> str:
    """One line from `stream`, or "" at its end or when the switch is set while waiting."""
    if stream is None or getattr(stream, "closed", False):
        return ""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (an embedding app's stream)
        fd = None
    if fd is None or sys.platform == "win32":  # select() takes only sockets on Windows
        return stream.readline()
    # Raw reads with select(), so the stop hotkey ends the prompt at once instead of after Enter.
    buffered = _pending.pop(fd, b"")
    while b"\n" not in buffered:
        if switch is not None and switch.is_set():
            return ""  # the run ends; a half-typed answer goes with it
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # end of input: whatever came without a newline is the answer
            return buffered.decode(errors="replace")
        buffered += chunk
    line, _, rest = buffered.partition(b"\n")
    if rest:
        _pending[fd] = rest
    return line.decode(errors="replace")


def terminal_confirm(
    action: A.Action, pixels: Pixels, shot: Screenshot, switch: StopSwitch | None = None, stream=None,
    stop_chord: frozenset[str] = frozenset(),
) -> bool:  # fmt: skip
    """Ask on the terminal; anything but y/yes (including end of input or a stop) is a no."""
    why = system_chord(action.keys, stop_chord) if isinstance(action, A.Key) else ""
    warning = f" WARNING: a system key combination ({why})." if why else ""
    print(f"qvl-agent: {describe_pixels(action, pixels)}.{warning} Do it? [y/N] ", end="", file=sys.stderr, flush=True)
    line = read_line(sys.stdin if stream is None else stream, switch)
    if switch is not None and switch.is_set():
        print(file=sys.stderr, flush=True)  # end the prompt's line before the stop message
        return False
    return line.strip().lower() in ("y", "yes")


def _acts_at_the_pointer(action: A.Action) -> bool:
    """A scroll without a point or a drag without a start: it acts wherever the pointer is."""
    if isinstance(action, A.Scroll | A.HScroll):
        return action.x is None or action.y is None
    return isinstance(action, A.LeftClickDrag) and (action.start_x is None or action.start_y is None)


class Guard:
    """Checks every action before it runs: stop switch, confinement, and the person's yes in confirm mode."""

    def __init__(
        self,
        mode: str = "confirm",
        confine: Region | None = None,
        switch: StopSwitch | None = None,
        confirm: Confirm | None = None,
        hotkey: str | None = None,
        allow_keys: bool = False,
        max_actions_per_reply: int = Settings.max_actions_per_reply,
        max_type_chars: int = Settings.max_type_chars,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.confine = confine
        self.switch = switch or StopSwitch()
        self.confirm = confirm or self._ask_terminal
        self.hotkey = hotkey
        self.allow_keys = allow_keys
        self.max_actions_per_reply = max_actions_per_reply
        self.max_type_chars = max_type_chars
        try:
            self.stop_chord = hotkey_chord(hotkey_keys(hotkey)) if hotkey else frozenset()
        except ConfigError:
            self.stop_chord = frozenset()  # `start` says why the hotkey is unusable
        self._listener: HotkeyListener | None = None

    @classmethod
    def for_settings(cls, settings: Settings, mode: str, **kwargs) -> Guard:
        """A guard with the person's limits from the settings (actions per reply, typed characters)."""
        return cls(
            mode=mode,
            max_actions_per_reply=settings.max_actions_per_reply,
            max_type_chars=settings.max_type_chars,
            **kwargs,
        )

    def _ask_terminal(self, action: A.Action, pixels: Pixels, shot: Screenshot) -> bool:
        return terminal_confirm(action, pixels, shot, switch=self.switch, stop_chord=self.stop_chord)

    def start(self) -> str:
        """Start the stop hotkey listener if one is configured. Returns "" or one sentence saying why the
        hotkey is not available (the run can go on: Ctrl+C in the terminal still stops it)."""
        if not self.hotkey or self._listener is not None:
            return ""
        listener = HotkeyListener(self.hotkey, self.switch)
        try:
            listener.start()
        except RuntimeError as exc:
            return f"The emergency stop hotkey is not available: {exc}."
        self._listener = listener
        return ""

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def stop(self, reason: str = "The run was stopped.") -> None:
        self.switch.stop(reason)

    def sleep(self, seconds: float) -> None:
        self.switch.sleep(seconds)

    def pixels(self, action: A.Action, shot: Screenshot) -> Pixels:
        """The physical pixels the action touches, refusing points off the screen or outside confinement."""
        pixels = [to_pixels(x, y, shot) for x, y in A.points(action)]
        if self.confine is not None and _acts_at_the_pointer(action):
            # Where the pointer happens to be is no point the guard can check: it may lie outside the region.
            raise OffScreenError(
                f"{A.describe(action)} would act wherever the pointer is, and this run may only act inside "
                "its region; give the point to act at (`coordinate`, and `start_coordinate` for a drag)."
            )
        if self.confine is not None:
            for (x, y), (px, py) in zip(A.points(action), pixels, strict=True):
                if not self.confine.contains(px, py):
                    c = self.confine
                    raise OffScreenError(
                        f"The point ({x:g}, {y:g}) is pixel ({px}, {py}), outside the allowed area "
                        f"{c.width}x{c.height} at ({c.left}, {c.top}); choose a point inside it."
                    )
        return pixels

    def check_reply(self, actions: list[A.Action]) -> None:
        """ActionError when one reply holds more actions than may run at once (then none of them runs)."""
        if len(actions) > self.max_actions_per_reply:
            raise ActionError(
                f"The reply has {len(actions)} actions, but at most {self.max_actions_per_reply} run per reply, "
                "so none of them ran; send fewer actions at a time."
            )

    def check(self, action: A.Action, shot: Screenshot) -> Pixels:
        """Raise EmergencyStop, ActionError (OffScreenError, a limit, a refused system key), or return the
        action's pixels once it may run."""
        self.switch.check()
        if isinstance(action, A.Type) and len(action.text) > self.max_type_chars:
            raise ActionError(
                f"The text to type has {len(action.text)} characters, but one type action may type at most "
                f"{self.max_type_chars}; type it in shorter parts."
            )
        pixels = self.pixels(action, shot)
        why = "" if self.allow_keys or not isinstance(action, A.Key) else system_chord(action.keys, self.stop_chord)
        if why and self.mode == "auto":
            if not self.confirm(action, pixels, shot):
                self.switch.check()
                raise ActionError(
                    f"{A.describe(action)} was refused: {why}. Reach the goal without system key combinations."
                )
        elif self.mode == "confirm" and not isinstance(action, (*A.FINAL_ACTIONS, A.Wait)):
            if not self.confirm(action, pixels, shot):
                self.switch.stop(f"The person declined: {describe_pixels(action, pixels)}.")
        self.switch.check()  # a stop pressed while a question was open wins over a yes
        return pixels
