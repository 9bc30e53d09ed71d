"""What the person is asked before an action runs, in words: the model's reason and what will happen.

One function, `confirm_question`, for every face that asks (the terminal's `Do it?` in `qvl-agent run`,
the tray's dialog), so they say the same thing: what the model said besides its tool calls, and the
action as a person would put it ("click at pixel (399, 166)", "press ctrl+s", "type 'hello'"), in
screen pixels, never in the model's 0-1000 grid. Text from the model is left as it is: each face escapes
it for where it shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from qvl_agent import actions as A
from qvl_agent.act.keys import system_chord
from qvl_agent.parse import reply_words

Pixels = list[tuple[int, int]]

_CLICKS = {
    "left_click": "click",
    "right_click": "right-click",
    "middle_click": "middle-click",
    "double_click": "double-click",
    "triple_click": "triple-click",
}


def _at(pixels: Pixels, i: int = 0) -> str:
    return f"pixel ({pixels[i][0]}, {pixels[i][1]})" if len(pixels) > i else "the pointer"


def in_words(action: A.Action, pixels: Pixels) -> str:
    """What `action` will do, as a person would say it, with the screen pixels it lands on."""
    if isinstance(action, A.Key):
        return f"press {'+'.join(action.keys)}"
    if isinstance(action, A.Type):
        return f"type {action.text!r}"
    if isinstance(action, A.MouseMove):
        return f"move the pointer to {_at(pixels)}"
    if isinstance(action, A.LeftClickDrag):
        if len(pixels) > 1:
            return f"drag from {_at(pixels)} to {_at(pixels, 1)}"
        return f"drag from the pointer to {_at(pixels)}"
    if isinstance(action, A.Scroll | A.HScroll):
        ways = ("up", "down") if isinstance(action, A.Scroll) else ("right", "left")
        way = ways[0] if action.pixels >= 0 else ways[1]
        return f"scroll {way} {abs(action.pixels):g} at {_at(pixels)}"
    if isinstance(action, A.Wait):
        return f"wait {action.seconds:g} s"
    if isinstance(action, A.Terminate):
        return f"end the task ({action.status})"
    if isinstance(action, A.Answer):
        return f"answer {action.text!r}"
    if isinstance(action, A.HandleDialog):
        if not action.accept:
            return "dismiss the page's dialog (Cancel)"
        return "accept the page's dialog (OK)" + (f" with the text {action.text!r}" if action.text is not None else "")
    return f"{_CLICKS.get(action.kind, action.kind)} at {_at(pixels)}"


@dataclass(frozen=True)
class ConfirmQuestion:
    reason: str  # what the model said around its tool calls; "" when it said nothing else
    doing: str  # the action in words, with its pixels
    warning: str = ""  # what a system key combination does ("" for any other action)


def confirm_question(
    action: A.Action, pixels: Pixels, reply: str = "", stop_chord: frozenset[str] = frozenset()
) -> ConfirmQuestion:
    """What to ask the person about `action`, which the model chose in `reply`."""
    why = system_chord(action.keys, stop_chord) if isinstance(action, A.Key) else ""
    warning = f"a system key combination ({why})" if why else ""
    return ConfirmQuestion(reply_words(reply), in_words(action, pixels), warning)


def declined_message(action: A.Action) -> str:
    """What the model is told when the person said no to `action` (it then tries something else)."""
    return f"The person declined {A.describe(action)}: do something else, or end the task if there is no other way."
