"""Grounding: "where is X?" answered with one point on the screen.

Uses the single-click prompt Qwen3-VL is benchmarked with on ScreenSpot (`prompts/grounding.txt`: the
`computer_use` tool limited to `left_click` on the 0-1000 grid, and the instruction to click the element,
guessing when unsure), the screenshot then the description, greedy decoding. The reply's first point (a
`left_click` tool call, or a bare `point_2d`/`bbox_2d` answer) is mapped to physical pixels through the
screenshot's geometry. Used by `qvl-agent locate`, the evaluation harness, the MCP server and the tray.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from qvl_agent import actions as A
from qvl_agent import prompts
from qvl_agent.engine.base import Engine, GenerationOptions
from qvl_agent.errors import ParseError
from qvl_agent.image import GRID, Screenshot, to_pixels
from qvl_agent.parse import parse_actions, parse_point


@dataclass(frozen=True)
class GroundedPoint:
    x: int  # physical pixels of the virtual desktop
    y: int
    model_x: float  # the model's answer on the 0-1000 grid
    model_y: float
    ms: float  # model time, from the question to the whole reply
    reply: str


def system_prompt() -> str:
    return prompts.load("grounding").render(screen_width=GRID, screen_height=GRID)


def point_in_reply(reply: str) -> tuple[float, float]:
    """The model point a grounding reply names; ParseError when it names none."""
    try:
        for action in parse_actions(reply):
            touched = A.points(action)
            if touched:
                return touched[-1]
    except ParseError:
        pass
    found = parse_point(reply)
    if found is None:
        raise ParseError(f"The model's answer names no point on the screen: {reply.strip()[:200]!r}.")
    return found


def locate(
    engine: Engine, shot: Screenshot, description: str, options: GenerationOptions | None = None
) -> GroundedPoint:
    """Ask where `description` is on `shot`; the answer in model and screen coordinates."""
    description = description.strip()
    if not description:
        raise ParseError('Say what to find, e.g. "the Save button".')
    start = time.perf_counter()
    session = engine.open_session(system=system_prompt())
    try:
        reply = session.complete(description, [shot], options or GenerationOptions(max_new_tokens=128))
    finally:
        session.close()
    ms = (time.perf_counter() - start) * 1000
    mx, my = point_in_reply(reply)
    mx, my = min(max(mx, 0.0), float(GRID)), min(max(my, 0.0), float(GRID))
    x, y = to_pixels(mx, my, shot)
    return GroundedPoint(x, y, mx, my, ms, reply)
