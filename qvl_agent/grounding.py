"""Grounding: "where is X?" answered with one point on the screen.

Asks the way Qwen3-VL is benchmarked on ScreenSpot-Pro (the public Qwen3-VL adapter of the
ScreenSpot-Pro evaluation): `prompts/grounding.txt` is that adapter's system prompt byte for byte (the
instruction to click the element, guessing when unsure, and a `computer_use` tool limited to
`left_click` on a 1000x1000 screen; its quirks, raw newlines inside the tool JSON and one closing brace
short, are the adapter's and kept on purpose), then one user turn holding the screenshot and then the
description, greedy decoding. The reply's point is read the way the adapter reads it: the tool call's
`coordinate` ([x, y], or the centre of [x1, y1, x2, y2]) whatever the action or tool is called; a bare
`point_2d`/`bbox_2d` answer is accepted too. The point is clamped to the 0-1000 grid and mapped to
physical pixels through the screenshot's geometry (monitor offset and scale). Used by `qvl-agent locate`,
`qvl-agent eval screenspot`, the MCP server, the tray and `replay --heal` (`point_or_click`: the agent's
computer-use turn as a fallback). Imports no torch, Qt or Playwright.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from qvl_agent import actions as A
from qvl_agent import prompts
from qvl_agent.engine.base import Engine, GenerationOptions
from qvl_agent.errors import ParseError
from qvl_agent.image import GRID, Screenshot, to_pixels
from qvl_agent.parse import parse_actions, parse_point

MAX_NEW_TOKENS = 128  # a left_click call is ~30 tokens; the adapter allows 100
_NUMBER = r"-?\d+(?:\.\d+)?"
_BOX_COORDINATE = re.compile(
    rf'"coordinate"\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]'
)
_POINT_COORDINATE = re.compile(rf'"coordinate"\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]')


@dataclass(frozen=True)
class GroundedPoint:
    x: int  # physical pixels of the virtual desktop (pixels of the image for an image file)
    y: int
    model_x: float  # the model's answer on the 0-1000 grid, clamped
    model_y: float
    ms: float  # model time, from the question to the whole reply
    reply: str


def system_prompt() -> str:
    return prompts.load("grounding").render(screen_width=GRID, screen_height=GRID)


def point_in_reply(reply: str) -> tuple[float, float]:
    """The model point a grounding reply names (0-1000 grid, not clamped); ParseError when it names none."""
    try:
        for action in parse_actions(reply):
            touched = A.points(action)
            if touched:
                return touched[-1]
    except ParseError:
        pass
    # The adapter reads the tool call's `coordinate` whatever the action or tool is called ("click",
    # "type", ...), and takes a 4-number coordinate as a box: its centre.
    point, box = _POINT_COORDINATE.search(reply), _BOX_COORDINATE.search(reply)
    if point and (not box or point.start() < box.start()):
        return float(point.group(1)), float(point.group(2))
    if box:
        x1, y1, x2, y2 = (float(g) for g in box.groups())
        return (x1 + x2) / 2, (y1 + y2) / 2
    found = parse_point(reply)
    if found is None:
        short = " ".join(reply.split())[:160]
        raise ParseError(f"The model's answer names no point on the screen: {short!r}.")
    return found


def ask(
    engine: Engine, shot: Screenshot, description: str, options: GenerationOptions | None = None
) -> tuple[str, float]:
    """The model's whole reply to the grounding question about `shot`, and the ms it took.
    ParseError when the description is empty; engine errors pass through."""
    description = description.strip()
    if not description:
        raise ParseError('Say what to find, e.g. "the Save button".')
    start = time.perf_counter()
    session = engine.open_session(system=system_prompt())
    try:
        reply = session.complete(description, [shot], options or GenerationOptions(max_new_tokens=MAX_NEW_TOKENS))
    finally:
        session.close()
    return reply, (time.perf_counter() - start) * 1000


def grounded(reply: str, ms: float, shot: Screenshot) -> GroundedPoint:
    """The point a reply names, clamped to the grid and mapped to `shot`'s pixels; ParseError when none."""
    mx, my = point_in_reply(reply)
    mx, my = min(max(mx, 0.0), float(GRID)), min(max(my, 0.0), float(GRID))
    x, y = to_pixels(mx, my, shot)
    return GroundedPoint(x, y, mx, my, ms, reply)


def locate(
    engine: Engine, shot: Screenshot, description: str, options: GenerationOptions | None = None
) -> GroundedPoint:
    """Ask where `description` is on `shot`; the answer in model and screen coordinates.
    ParseError when the description is empty or the reply names no point; engine errors pass through."""
    return grounded(*ask(engine, shot, description, options), shot)


def point_or_click(
    engine: Engine, shot: Screenshot, description: str, options: GenerationOptions | None = None
) -> tuple[str, tuple[int, int] | None]:
    """Where `description` is on `shot`, asked the grounding way first; when that reply names no point, the
    agent's own computer-use turn ("Click ...") as a second chance. Returns the replies and the point in
    `shot`'s pixels, or None when neither named one (`replay --heal` then stops rather than guess)."""
    reply, ms = ask(engine, shot, description, options)
    try:
        found = grounded(reply, ms, shot)
        return reply, (found.x, found.y)
    except ParseError:
        pass
    session = engine.open_session(system=prompts.load("computer_use").render(screen_width=GRID, screen_height=GRID))
    try:
        second = session.complete(f"Click {description.strip()}.", [shot], GenerationOptions(max_new_tokens=256))
    finally:
        session.close()
    try:
        for action in parse_actions(second):
            touched = A.points(action)
            if touched:
                mx, my = (min(max(float(v), 0.0), float(GRID)) for v in touched[0])
                return reply + "\n" + second, to_pixels(mx, my, shot)
    except ParseError:
        pass
    return reply + "\n" + second, None
