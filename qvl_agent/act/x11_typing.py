"""Typing text on X11 through XTest, one character at a time, by the character's own keysym.

pyautogui types on X11 through its own table of key names, which maps some characters to the wrong key
on common keymaps ("<" arrives as ">", upstream issues #580, #627, #730, #856) and cannot type anything
outside ASCII. Here every character is turned into its keysym (Latin-1 characters are their own keysym,
everything else is the Unicode keysym 0x01000000 + code point, which every XKB client understands), looked
up in the server's current keyboard map (plain, or with Shift), and pressed with XTest. A keysym the map
lacks is put on a spare keycode (as xdotool does) until the executor closes. The keyboard map is read
afresh for every text, so a layout switched between two steps is honoured.

Pure X11 (python-xlib, which pyautogui already needs there); `act.desktop` chooses it on Linux only.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from qvl_agent.errors import ActionError

UNICODE_KEYSYM = 0x01000000
_CONTROL = {"\n": 0xFF0D, "\r": 0xFF0D, "\t": 0xFF09, "\b": 0xFF08}  # Return, Tab, BackSpace
_SHIFT_L = 0xFFE1


def keysym_for(char: str) -> int:
    """The X keysym that types `char` (one code point)."""
    if char in _CONTROL:
        return _CONTROL[char]
    code = ord(char)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code  # the Latin-1 keysyms are the code points themselves
    return UNICODE_KEYSYM + code


def typable(char: str) -> bool:
    """Whether `char` can be typed at all: printable characters and newline/tab/backspace, no other
    control characters (they have no key)."""
    if len(char) != 1:
        return False
    code = ord(char)
    return char in _CONTROL or not (code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xE000)


class XTestTypist:
    """Types characters on the X display named by DISPLAY (the one pyautogui and mss use).

    A toolkit reads the keyboard map when it handles the map's change notice, not when the change was
    made, so a spare keycode must not be given another keysym (or its empty mapping back) while a key
    press on it may still be waiting in the target's queue: each keysym the map lacks gets a keycode of
    its own, a keycode is only reused `SETTLE_S` after its last press, and the lent keycodes are given
    back when the executor closes, not after every text."""

    SETTLE_S = 0.2

    def __init__(self, display=None, clock=time.monotonic, sleep=time.sleep):
        from Xlib import display as xdisplay

        self._display = display or xdisplay.Display()
        if not self._display.has_extension("XTEST"):
            raise ActionError("This X server has no XTEST extension, so text cannot be typed into it.")
        self._clock, self._sleep = clock, sleep
        self._map: dict[int, tuple[int, bool]] = {}
        self._empty: list[int] = []
        self._lent: dict[int, float] = {}  # keycode we gave a keysym -> when it was last pressed
        self._shift = 0

    def _read_map(self) -> None:
        d = self._display
        first = d.display.info.min_keycode
        rows = d.get_keyboard_mapping(first, d.display.info.max_keycode - first + 1)
        self._map, self._empty = {}, []
        for offset, row in enumerate(rows):
            code = first + offset
            plain, shifted = (list(row) + [0, 0])[:2]
            if shifted == 0:
                shifted = plain  # X's rule: a lone keysym serves both levels (its case pair for letters)
            for level, keysym in ((1, shifted), (0, plain)):  # plain wins when a keysym sits on both
                if keysym:
                    self._map[keysym] = (code, level == 1)
            if not any(row):
                self._empty.append(code)  # nothing on the keyboard produces it
        self._shift = self._map.get(_SHIFT_L, (0, False))[0]

    def _press(self, code: int, shift: bool) -> None:
        from Xlib import X
        from Xlib.ext import xtest

        d = self._display
        if shift:
            xtest.fake_input(d, X.KeyPress, self._shift)
        xtest.fake_input(d, X.KeyPress, code)
        xtest.fake_input(d, X.KeyRelease, code)
        if shift:
            xtest.fake_input(d, X.KeyRelease, self._shift)
        d.sync()

    def _settle(self, code: int) -> None:
        wait = self._lent.get(code, -1e9) + self.SETTLE_S - self._clock()
        if wait > 0:
            self._sleep(wait)

    def _lend(self, keysym: int) -> int:
        """A keycode that types `keysym`: an empty one, else the lent one pressed longest ago."""
        if self._empty:
            code = self._empty.pop()
        elif self._lent:
            code = min(self._lent, key=self._lent.__getitem__)
            self._settle(code)
            for old in [k for k, (c, _) in self._map.items() if c == code]:
                del self._map[old]
        else:
            raise ActionError("The keyboard map has no free key to type this character with.")
        self._display.change_keyboard_mapping(code, [(keysym, keysym)])
        self._display.sync()
        self._map[keysym] = (code, False)
        self._lent[code] = self._clock()
        return code

    def begin(self) -> None:
        """Read the keyboard map (the person may have switched layouts); call before a text."""
        self._read_map()

    def type_char(self, char: str) -> None:
        if not typable(char):
            raise ActionError(f"Cannot type the control character {char!r}; press it as a key instead.")
        keysym = keysym_for(char)
        code, shift = self._map.get(keysym, (0, False))
        if code and shift and not self._shift:
            code = 0  # no Shift key on this map: type it from a spare key instead
        if not code:
            code, shift = self._lend(keysym), False
        self._press(code, shift)
        if code in self._lent:
            self._lent[code] = self._clock()

    def end(self) -> None:
        """After a text: drop the change notices our own mapping changes sent us."""
        while self._display.pending_events():
            self._display.next_event()

    def restore_keymap(self) -> None:
        """Give every lent keycode its empty mapping back, once the last press on it has been read."""
        for code in list(self._lent):
            self._settle(code)
            self._display.change_keyboard_mapping(code, [(0, 0)])
            del self._lent[code]
        self._display.sync()
        self.end()


class X11Input:
    """The desktop executor's input on X11: pyautogui for the pointer and key chords, XTest for text.
    `typing()` brackets one text (reads the keyboard map, gives the spare keycode back afterwards);
    `write(char)` types one character inside it."""

    def __init__(self, pyautogui, typist: XTestTypist | None = None):
        self._pyautogui = pyautogui
        self._typist = typist

    def __getattr__(self, name: str):
        return getattr(self._pyautogui, name)

    @property
    def typist(self) -> XTestTypist:
        if self._typist is None:
            try:
                self._typist = XTestTypist()
            except ActionError:
                raise
            except Exception as exc:  # Xlib raises its own errors when the display cannot be opened
                raise ActionError(f"Cannot type on this display: {exc}.") from None
        return self._typist

    def can_type(self, char: str) -> bool:
        return typable(char)

    @contextmanager
    def typing(self):
        self.typist.begin()
        try:
            yield
        finally:
            self.typist.end()

    def write(self, char: str) -> None:
        self.typist.type_char(char)

    def restore_keymap(self) -> None:
        """Give the keyboard map back the keys lent for characters it lacked."""
        if self._typist is not None:
            self._typist.restore_keymap()
