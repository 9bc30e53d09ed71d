"""A field that records a hotkey by pressing it: it shows "Ctrl+Alt+Q" and holds pynput's "<ctrl>+<alt>+q".

Pressing a combination replaces the value; modifiers alone only preview it ("Ctrl+Alt+…"). Tab moves on,
Enter and Esc reach the dialog (save, cancel) and Backspace empties the field, so a hotkey cannot use those
keys without a modifier. The value is checked by `hotkeys.check_hotkey` when the dialog saves.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QLineEdit, QWidget

from qvl_agent.config import hotkey_label

K = Qt.Key
NAMED = {
    K.Key_Escape: "esc", K.Key_Space: "space", K.Key_Tab: "tab", K.Key_Backspace: "backspace",
    K.Key_Delete: "delete", K.Key_Insert: "insert", K.Key_Home: "home", K.Key_End: "end",
    K.Key_PageUp: "page_up", K.Key_PageDown: "page_down", K.Key_Left: "left", K.Key_Right: "right",
    K.Key_Up: "up", K.Key_Down: "down", K.Key_Return: "enter", K.Key_Enter: "enter",
    K.Key_Print: "print_screen", K.Key_Pause: "pause", K.Key_Menu: "menu",
}  # fmt: skip
M = Qt.KeyboardModifier
MODIFIER_KEYS = {
    K.Key_Control: M.ControlModifier, K.Key_Shift: M.ShiftModifier, K.Key_Alt: M.AltModifier,
    K.Key_AltGr: M.GroupSwitchModifier, K.Key_Meta: M.MetaModifier, K.Key_Super_L: M.MetaModifier,
    K.Key_Super_R: M.MetaModifier,
}  # fmt: skip
PASSED_ON = {K.Key_Return, K.Key_Enter, K.Key_Escape}  # without a modifier: the dialog's Save and Cancel
CLEARS = {K.Key_Backspace, K.Key_Delete}


def modifier_tokens(modifiers: Qt.KeyboardModifier) -> list[str]:
    """pynput's names for the held modifiers, in the order people say them."""
    control, meta = ("<cmd>", "<ctrl>") if sys.platform == "darwin" else ("<ctrl>", "<cmd>")  # Qt swaps them on macOS
    tokens = [control] if modifiers & M.ControlModifier else []
    tokens += ["<alt>"] if modifiers & M.AltModifier else []
    tokens += ["<shift>"] if modifiers & M.ShiftModifier else []
    tokens += [meta] if modifiers & M.MetaModifier else []
    return tokens


def key_token(key: int) -> str | None:
    """pynput's name for a Qt key that is not a modifier, or None for keys it cannot listen for."""
    if key in NAMED:
        return f"<{NAMED[Qt.Key(key)]}>"
    if K.Key_F1 <= key <= K.Key_F20:
        return f"<f{key - K.Key_F1 + 1}>"
    if 0x20 < key < 0x7F:  # Qt's codes for printable ASCII are the characters (letters upper case)
        return chr(key).lower()
    return None


def hotkey_from_event(event: QKeyEvent) -> str | None:
    """The pynput combination a key press makes, or None when the key is a modifier or unknown."""
    if event.key() in MODIFIER_KEYS:
        return None
    token = key_token(event.key())
    return "+".join([*modifier_tokens(event.modifiers()), token]) if token else None


class HotkeyEdit(QLineEdit):
    """Records a hotkey from key presses; `hotkey()` is the value in pynput syntax."""

    def __init__(self, hotkey: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)  # nothing is typed: presses are recorded
        self.setPlaceholderText("Press the keys, e.g. Ctrl+Alt+Q")
        self.setToolTip("Click here and press the key combination")
        self._hotkey = ""
        self.set_hotkey(hotkey)

    def hotkey(self) -> str:
        return self._hotkey

    def set_hotkey(self, hotkey: str) -> None:
        self._hotkey = hotkey.strip()
        self.setText(hotkey_label(self._hotkey) if self._hotkey else "")

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt naming)
        plain = not modifier_tokens(event.modifiers())
        if plain and event.key() in PASSED_ON:
            event.ignore()
            return
        if plain and event.key() in CLEARS:
            self.set_hotkey("")
            return
        combo = hotkey_from_event(event)
        if combo is not None:
            self.set_hotkey(combo)
        elif event.key() in MODIFIER_KEYS:
            # Whether a modifier's own press counts it as held differs by platform: count it always.
            self._preview(event.modifiers() | MODIFIER_KEYS[Qt.Key(event.key())])
        event.accept()

    def keyReleaseEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() in MODIFIER_KEYS:
            self._preview(event.modifiers() & ~MODIFIER_KEYS[Qt.Key(event.key())])
        event.accept()

    def _preview(self, held: Qt.KeyboardModifier) -> None:
        """ "Ctrl+Alt+…" while modifiers are held without a key; the value again once all are let go."""
        tokens = modifier_tokens(held)
        if tokens:
            self.setText(hotkey_label("+".join(tokens)) + "+…")
        else:
            self.set_hotkey(self._hotkey)
