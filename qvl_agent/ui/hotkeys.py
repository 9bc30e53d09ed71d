"""Global hotkeys: a pynput listener thread whose presses arrive as Qt signals in the GUI thread.

Hotkeys use pynput's syntax ("<ctrl>+<alt>+q"). `check_hotkey` validates one without importing pynput
(which needs a display at import), so the settings dialog can refuse a bad value anywhere.
On X11 pynput sees every key press, including ones synthesized by xdotool; under Wayland it only sees
presses while an XWayland window has focus, which `problem()` explains.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from qvl_agent import capture
from qvl_agent.act.guard import start_hotkeys
from qvl_agent.config import Hotkeys, check_hotkey, check_hotkeys, hotkey_label  # noqa: F401  (the syntax is a setting's)


def problem() -> str | None:
    """Why global hotkeys cannot work here, as one sentence, or None."""
    display = capture.display_kind()
    if display in ("none", "wayland"):
        return "Global hotkeys need an X11 display (DISPLAY is not set)."
    if display == "xwayland":
        return (
            "This is a Wayland session: pynput hears hotkeys only while an XWayland window has focus; "
            "bind a desktop shortcut to `qvl-agent tray --send ask` instead."
        )
    return None


class HotkeyListener(QObject):
    """pynput GlobalHotKeys → `ask`, `region`, `stop` and `takeover` signals (queued into the GUI thread)."""

    ask = Signal()
    region = Signal()
    stop = Signal()
    takeover = Signal()

    def __init__(self, hotkeys: Hotkeys, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.hotkeys = hotkeys
        self._listener = None

    def start(self) -> str | None:
        """Start listening; returns why hotkeys are unavailable, or None when they work."""
        self.stop_listening()
        # Signals emitted from pynput's thread are queued to the GUI thread by Qt.
        mapping = {
            self.hotkeys.ask: self.ask.emit,
            self.hotkeys.region: self.region.emit,
            self.hotkeys.stop: self.stop.emit,
            self.hotkeys.takeover: self.takeover.emit,
        }
        try:
            self._listener = start_hotkeys(mapping)
        except RuntimeError as exc:
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
