"""Actions as data: one frozen dataclass per Qwen3-VL `computer_use` action.

Every action carries a `kind` tag equal to the `action` name in Qwen3-VL's tool call. Coordinates on
actions are MODEL coordinates: relative positions on a 0-1000 grid over the screenshot the model looked
at (see `image.to_pixels` for the one place they become pixels). This module knows nothing about screens,
pixels or how an action is carried out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal

Point = tuple[float, float]


@dataclass(frozen=True)
class Key:
    """Press the keys in order, release them in reverse order (a chord like ctrl+c, or one key)."""

    keys: tuple[str, ...]
    kind: ClassVar[str] = "key"


@dataclass(frozen=True)
class Type:
    """Type a string on the keyboard."""

    text: str
    kind: ClassVar[str] = "type"


@dataclass(frozen=True)
class MouseMove:
    x: float
    y: float
    kind: ClassVar[str] = "mouse_move"


@dataclass(frozen=True)
class LeftClick:
    x: float
    y: float
    kind: ClassVar[str] = "left_click"


@dataclass(frozen=True)
class RightClick:
    x: float
    y: float
    kind: ClassVar[str] = "right_click"


@dataclass(frozen=True)
class MiddleClick:
    x: float
    y: float
    kind: ClassVar[str] = "middle_click"


@dataclass(frozen=True)
class DoubleClick:
    x: float
    y: float
    kind: ClassVar[str] = "double_click"


@dataclass(frozen=True)
class TripleClick:
    x: float
    y: float
    kind: ClassVar[str] = "triple_click"


@dataclass(frozen=True)
class LeftClickDrag:
    """Drag with the left button to (x, y). Qwen's `coordinate` is the end point; the drag starts at
    the current pointer position unless a start is given (`start_coordinate`)."""

    x: float
    y: float
    start_x: float | None = None
    start_y: float | None = None
    kind: ClassVar[str] = "left_click_drag"


@dataclass(frozen=True)
class Scroll:
    """Scroll the wheel by `pixels` (positive up, negative down), at (x, y) when given."""

    pixels: float
    x: float | None = None
    y: float | None = None
    kind: ClassVar[str] = "scroll"


@dataclass(frozen=True)
class HScroll:
    """Scroll horizontally by `pixels` (positive right, negative left), at (x, y) when given."""

    pixels: float
    x: float | None = None
    y: float | None = None
    kind: ClassVar[str] = "hscroll"


@dataclass(frozen=True)
class Wait:
    seconds: float
    kind: ClassVar[str] = "wait"


@dataclass(frozen=True)
class Terminate:
    """The model ends the task and reports how it went."""

    status: Literal["success", "failure"]
    kind: ClassVar[str] = "terminate"


@dataclass(frozen=True)
class Answer:
    """The model answers a question; this ends the run successfully."""

    text: str
    kind: ClassVar[str] = "answer"


@dataclass(frozen=True)
class HandleDialog:
    """Answer the dialog a web page opened (alert, confirm, prompt, beforeunload): accept it (OK) or dismiss
    it (Cancel); `text` is what a prompt() gets when accepted. Only the browser has dialogs, and it asks for
    this action when one opens (Playwright MCP's `browser_handle_dialog`)."""

    accept: bool
    text: str | None = None
    kind: ClassVar[str] = "handle_dialog"


@dataclass(frozen=True)
class CallUser:
    """Hand the run to the person (a password it was not given, a second factor, a CAPTCHA, a payment to
    confirm): the run pauses after this step, shows `text` as the reason, and goes on when they hand back.
    Not one of Qwen's computer_use actions: described to the model in the task turn (`prompts/call_user.txt`)."""

    text: str
    kind: ClassVar[str] = "call_user"


Action = (
    Key
    | Type
    | MouseMove
    | LeftClick
    | RightClick
    | MiddleClick
    | DoubleClick
    | TripleClick
    | LeftClickDrag
    | Scroll
    | HScroll
    | Wait
    | Terminate
    | Answer
    | HandleDialog
    | CallUser
)

POINTER_ACTIONS = (MouseMove, LeftClick, RightClick, MiddleClick, DoubleClick, TripleClick)
_OTHER_ACTIONS = (Key, Type, LeftClickDrag, Scroll, HScroll, Wait, Terminate, Answer, HandleDialog, CallUser)
ALL_ACTIONS = (*POINTER_ACTIONS, *_OTHER_ACTIONS)
KINDS: dict[str, type] = {cls.kind: cls for cls in ALL_ACTIONS}
FINAL_ACTIONS = (Terminate, Answer)


def points(action: Action) -> list[Point]:
    """Every model point the action touches, in the order it touches them (empty for key, type, ...)."""
    if isinstance(action, POINTER_ACTIONS):
        return [(action.x, action.y)]
    if isinstance(action, LeftClickDrag):
        start = [] if action.start_x is None or action.start_y is None else [(action.start_x, action.start_y)]
        return [*start, (action.x, action.y)]
    if isinstance(action, Scroll | HScroll) and action.x is not None and action.y is not None:
        return [(action.x, action.y)]
    return []


def _num(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def to_arguments(action: Action) -> dict:
    """The action as the `arguments` of a Qwen3-VL computer_use tool call (what the model writes)."""
    args: dict = {"action": action.kind}
    if isinstance(action, Key):
        args["keys"] = list(action.keys)
    elif isinstance(action, Type | Answer | CallUser):
        args["text"] = action.text
    elif isinstance(action, Wait):
        args["time"] = _num(action.seconds)
    elif isinstance(action, Terminate):
        args["status"] = action.status
    elif isinstance(action, Scroll | HScroll):
        args["pixels"] = _num(action.pixels)
    elif isinstance(action, HandleDialog):
        args["accept"] = action.accept
        if action.text is not None:
            args["text"] = action.text
    if isinstance(action, LeftClickDrag) and action.start_x is not None and action.start_y is not None:
        args["start_coordinate"] = [_num(action.start_x), _num(action.start_y)]
    if isinstance(action, (*POINTER_ACTIONS, LeftClickDrag, Scroll, HScroll)) and action.x is not None:
        args["coordinate"] = [_num(action.x), _num(action.y)]
    return args


# C0 and C1 control characters (escape sequences, carriage return, backspace) and the bidi overrides that
# reorder what a terminal shows: model text must never drive the person's terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str, keep: str = "") -> str:
    """`text` safe to show on a terminal or in a one-line comment: control characters become escapes
    like `\x1b` or `\n`, except those in `keep` (e.g. "\n" for a multi-line answer)."""

    def escape(m: re.Match) -> str:
        ch = m.group(0)
        return ch if ch in keep else ch.encode("unicode_escape").decode("ascii")

    return _CONTROL.sub(escape, text)


def describe(action: Action) -> str:
    """A short human-readable line, e.g. `left_click at (500, 310)` or `type "hello"`; safe to print."""
    if isinstance(action, Key):
        return f"key {printable('+'.join(action.keys))}"
    if isinstance(action, Type):
        return f"type {action.text!r}"
    if isinstance(action, Answer):
        return f"answer {action.text!r}"
    if isinstance(action, CallUser):
        return f"call_user {action.text!r}"
    if isinstance(action, Wait):
        return f"wait {_num(action.seconds)} s"
    if isinstance(action, Terminate):
        return f"terminate ({action.status})"
    if isinstance(action, HandleDialog):
        text = f" with {action.text!r}" if action.accept and action.text is not None else ""
        return f"handle_dialog {'accept' if action.accept else 'dismiss'}{text}"
    if isinstance(action, Scroll | HScroll):
        where = f" at ({_num(action.x)}, {_num(action.y)})" if action.x is not None else ""
        return f"{action.kind} {_num(action.pixels)}{where}"
    if isinstance(action, LeftClickDrag):
        start = f"({_num(action.start_x)}, {_num(action.start_y)})" if action.start_x is not None else "the pointer"
        return f"left_click_drag from {start} to ({_num(action.x)}, {_num(action.y)})"
    return f"{action.kind} at ({_num(action.x)}, {_num(action.y)})"
