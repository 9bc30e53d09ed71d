"""Key names: the one table from what Qwen3-VL writes to what the executors press, and which chords
belong to the operating system rather than to the app under control.

The model writes xdotool/pyautogui-style names in any case ("Return", "ctrl", "Page_Down", "cmd").
`canonical` folds them onto pyautogui's names ("enter", "ctrl", "pagedown", "win"); the desktop
executor presses those (with "win" as "command" on macOS) and the browser executor looks them up in
`PLAYWRIGHT`. Pure: no pyautogui or Playwright import.
"""

from __future__ import annotations

ALIASES = {
    "control": "ctrl",
    "return": "enter",
    "escape": "esc",
    "del": "delete",
    "ins": "insert",
    "bksp": "backspace",
    "spacebar": "space",
    "page_up": "pageup",
    "page_down": "pagedown",
    "pgup": "pageup",
    "pgdn": "pagedown",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "option": "alt",
    "super": "win",
    "meta": "win",
    "cmd": "win",
    "command": "win",
    "caps_lock": "capslock",
    "print_screen": "printscreen",
}

# canonical name -> Playwright's KeyboardEvent.key name
PLAYWRIGHT = {
    "ctrl": "Control",
    "alt": "Alt",
    "shift": "Shift",
    "win": "Meta",
    "enter": "Enter",
    "esc": "Escape",
    "tab": "Tab",
    "backspace": "Backspace",
    "delete": "Delete",
    "insert": "Insert",
    "space": "Space",
    "up": "ArrowUp",
    "down": "ArrowDown",
    "left": "ArrowLeft",
    "right": "ArrowRight",
    "home": "Home",
    "end": "End",
    "pageup": "PageUp",
    "pagedown": "PageDown",
    "capslock": "CapsLock",
    "printscreen": "PrintScreen",
    **{f"f{n}": f"F{n}" for n in range(1, 13)},
}

# pynput hotkey names (the stop hotkey's syntax) -> canonical names
_PYNPUT = {"ctrl_l": "ctrl", "ctrl_r": "ctrl", "alt_l": "alt", "alt_r": "alt", "alt_gr": "alt", "shift_l": "shift",
           "shift_r": "shift", "cmd": "win", "cmd_l": "win", "cmd_r": "win", "page_up": "pageup",
           "page_down": "pagedown", "caps_lock": "capslock", "print_screen": "printscreen"}  # fmt: skip


def canonical(key: str) -> str:
    """Qwen's key name as pyautogui's, e.g. "Return" -> "enter", "Page_Down" -> "pagedown", "cmd" -> "win".
    One character stays as it is ("A" types a capital A)."""
    if len(key) == 1:
        return key
    name = key.strip().lower().replace(" ", "")
    return ALIASES.get(name, name)


def from_pynput(name: str) -> str:
    """A pynput key name ("ctrl_l", "page_down", "esc", "cmd") as its canonical name ("ctrl", "pagedown", "esc",
    "win"): what a person pressed, named as the model names it."""
    return canonical(_PYNPUT.get(name, name))


def hotkey_chord(pynput_keys: list[str]) -> frozenset[str]:
    """A pynput hotkey's key names (from `config.hotkey_keys`) as a chord of canonical names."""
    return frozenset(from_pynput(k) for k in pynput_keys)


# pyautogui also presses one side of a modifier by name: for the system's shortcuts the side does not matter.
_SIDES = {f"{m}{side}": base for m, base in (("ctrl", "ctrl"), ("alt", "alt"), ("option", "alt"), ("shift", "shift"),
          ("win", "win")) for side in ("left", "right")}  # fmt: skip
_LOCK_KEYS = {"l", "q", "delete"}  # with the super key: lock (win+l), log out (super+shift+q, ctrl+cmd+q)
_SESSION_KEYS = {"delete", "backspace", "l", *(f"f{n}" for n in range(1, 13))}  # with ctrl+alt


def system_chord(keys: tuple[str, ...] | list[str], stop: frozenset[str] = frozenset()) -> str:
    """Why pressing `keys` would act on the session rather than the app (log out, lock, switch to a text
    console, restart the X server, suspend, press the emergency stop), in a few words; "" for an ordinary
    chord."""
    chord = {_SIDES.get(name, name) for name in (canonical(k).lower() for k in keys)}
    if stop and chord == set(stop):
        return "it is the emergency stop hotkey"
    if "sleep" in chord:
        return "the Sleep key suspends the computer"
    if "win" in chord and (chord == {"win"} or chord & _LOCK_KEYS):
        return "the super key alone or with L, Q or Delete opens the system menu, locks or logs out"
    if {"ctrl", "alt"} <= chord and chord & _SESSION_KEYS:
        return "ctrl+alt with Delete, Backspace, L or F1-F12 logs out, locks, kills the X server or switches console"
    return ""
