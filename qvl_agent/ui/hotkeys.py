"""Global hotkeys: a pynput listener thread whose presses arrive as Qt signals in the GUI thread.

Hotkeys use pynput's syntax ("<ctrl>+<alt>+q"). `check_hotkey` validates one without importing pynput
(which needs a display at import), so the settings dialog can refuse a bad value anywhere.
On X11 pynput sees every key press, including ones synthesized by xdotool; under Wayland it only sees
presses while an XWayland window has focus, which `problem()` explains.
"""

from __future__ import annotations

import os
import sys

from PySide6.QtCore import QObject, Signal

from qvl_agent.config import Hotkeys, hotkey_label
from qvl_agent.errors import ConfigError

MODIFIERS = {"ctrl", "ctrl_l", "ctrl_r", "alt", "alt_l", "alt_r", "alt_gr", "shift", "shift_l", "shift_r",
             "cmd", "cmd_l", "cmd_r"}  # fmt: skip
NAMED_KEYS = MODIFIERS | {
    "backspace", "caps_lock", "delete", "down", "end", "enter", "esc", "home", "insert", "left", "menu",
    "num_lock", "page_down", "page_up", "pause", "print_screen", "right", "scroll_lock", "space", "tab", "up",
    *(f"f{n}" for n in range(1, 21)),
}  # fmt: skip


def check_hotkey(text: str, what: str = "hotkey") -> str:
    """`text` unchanged when pynput can listen for it, else ConfigError with one sentence."""
    parts = text.strip().lower().split("+")
    example = "like <ctrl>+<alt>+q"
    if not text.strip():
        raise ConfigError(
            f"The {what} hotkey is empty: press a combination like Ctrl+Alt+Q in Settings "
            f"(or write one {example} in config.toml)."
        )
    if any(not p for p in parts):
        raise ConfigError(f"The {what} hotkey {text!r} is not a key combination {example}.")
    keys = []
    for part in parts:
        if part.startswith("<") and part.endswith(">"):
            name = part[1:-1]
            if name not in NAMED_KEYS and not name.isdigit():
                raise ConfigError(f"The {what} hotkey {text!r} names an unknown key <{name}>.")
            keys.append(name)
        elif len(part) == 1:
            keys.append(part)
        else:
            raise ConfigError(
                f"The {what} hotkey {text!r} has {part!r}: write named keys in angle brackets, {example}."
            )
    shown = hotkey_label(text)  # well formed from here on: say it as people write it
    if len(set(keys)) != len(keys):
        raise ConfigError(f"The {what} hotkey {shown} repeats a key.")
    if all(k in MODIFIERS for k in keys):
        raise ConfigError(f"The {what} hotkey {shown} needs a key besides the modifiers.")
    if not any(k in MODIFIERS for k in keys) and not any(k.startswith("f") and k[1:].isdigit() for k in keys):
        raise ConfigError(f"The {what} hotkey {shown} needs a modifier (Ctrl, Alt, Shift or Super), like Ctrl+Alt+Q.")
    return text.strip()


def check_hotkeys(hotkeys: Hotkeys) -> Hotkeys:
    """Every hotkey valid and no two the same, else ConfigError."""
    values = {name: check_hotkey(getattr(hotkeys, name), name) for name in ("ask", "region", "stop")}
    normalized = {name: "+".join(sorted(v.lower().split("+"))) for name, v in values.items()}
    if len(set(normalized.values())) != len(normalized):
        raise ConfigError("The ask, region and stop hotkeys must all be different.")
    return hotkeys


def problem() -> str | None:
    """Why global hotkeys cannot work here, as one sentence, or None."""
    if sys.platform.startswith("linux"):
        wayland = bool(os.environ.get("WAYLAND_DISPLAY")) or os.environ.get("XDG_SESSION_TYPE") == "wayland"
        if not os.environ.get("DISPLAY"):
            return "Global hotkeys need an X11 display (DISPLAY is not set)."
        if wayland:
            return (
                "This is a Wayland session: pynput hears hotkeys only while an XWayland window has focus; "
                "bind a desktop shortcut to `qvl-agent tray --send ask` instead."
            )
    return None


class HotkeyListener(QObject):
    """pynput GlobalHotKeys → `ask`, `region` and `stop` signals (queued into the GUI thread)."""

    ask = Signal()
    region = Signal()
    stop = Signal()

    def __init__(self, hotkeys: Hotkeys, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.hotkeys = hotkeys
        self._listener = None

    def start(self) -> str | None:
        """Start listening; returns why hotkeys are unavailable, or None when they work."""
        self.stop_listening()
        try:
            from pynput import keyboard  # lazily: importing pynput without a display raises
        except Exception as exc:
            return f"Global hotkeys are unavailable: {exc}."
        # Signals emitted from pynput's thread are queued to the GUI thread by Qt.
        mapping = {
            self.hotkeys.ask: self.ask.emit,
            self.hotkeys.region: self.region.emit,
            self.hotkeys.stop: self.stop.emit,
        }
        try:
            self._listener = keyboard.GlobalHotKeys(mapping)
            self._listener.daemon = True
            self._listener.start()
            self._listener.wait()
        except Exception as exc:
            self._listener = None
            return f"Global hotkeys could not be registered: {exc}."
        return None

    def restart(self, hotkeys: Hotkeys) -> str | None:
        self.hotkeys = hotkeys
        return self.start()

    def stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
