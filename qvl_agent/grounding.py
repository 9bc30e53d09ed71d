"""Grounding: "where is X?" answered with one point on the screen, asked the way the model was trained.

Each model profile (`qvl_agent.profiles`) says how: its system prompt or none, its user text (the
instruction through the profile's template), whether the text goes before the image, greedy decoding
with its token budget, and which parser reads the reply. For Qwen3-VL (the default) that is the public
Qwen3-VL adapter of the ScreenSpot-Pro evaluation: `prompts/grounding.txt` byte for byte (a
`computer_use` tool limited to `left_click` on a 1000x1000 screen; its quirks, raw newlines inside the
tool JSON and one closing brace short, are the adapter's and kept on purpose), the screenshot, then the
description; the reply's point is the tool call's `coordinate` ([x, y], or the centre of [x1, y1, x2,
y2]) whatever the action or tool is called, or a bare `point_2d`/`bbox_2d`. A profile's refusal form
([-1,-1], a failure call) raises `NotOnScreen`, one sentence. The point is clamped to the 0-1000 grid and
mapped to physical pixels through the screenshot's geometry (monitor offset and scale).

Zoom-in (`Zoom`): a second pass on a crop centred on the first point, a fraction of each side, shifted
to stay inside the screen (`image.zoom_region`); the crop carries its place on the desktop, so its answer
maps back through the same `to_pixels`. Used by `locate`, `eval screenspot`, the MCP server, the tray and
`replay --heal` (`point_or_click`: the agent's computer-use turn as a fallback). The engine's profile is
`engine.profile` (set by `open_engine`); imports no torch, Qt or Playwright.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from qvl_agent import actions as A
from qvl_agent import prompts
from qvl_agent.engine.base import Engine, GenerationOptions, sampling_defaults
from qvl_agent.errors import NotOnScreen, ParseError
from qvl_agent.image import GRID, Screenshot, to_model, to_pixels, zoom_region
from qvl_agent.parse import parse_actions, parse_point
from qvl_agent.profiles import DEFAULT, Profile

MAX_NEW_TOKENS = 128  # a left_click call is ~30 tokens; the adapter allows 100
_NUMBER = r"-?\d+(?:\.\d+)?"
_BOX_COORDINATE = re.compile(
    rf'"coordinate"\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]'
)
_POINT_COORDINATE = re.compile(rf'"coordinate"\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]')
_INT = r"-?\d+"
_BARE_BOX = re.compile(rf"\[\s*({_INT})\s*,\s*({_INT})\s*,\s*({_INT})\s*,\s*({_INT})\s*\]")
_BARE_POINT = re.compile(rf"\[\s*({_INT})\s*,\s*({_INT})\s*\]")
_TWO_POINTS = re.compile(rf"\[({_INT}),({_INT})\],\[({_INT}),({_INT})\]")
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)
_MAI_POINT = re.compile(r"\[\s*(\d+)\s*,\s*(\d+)\s*\]")
_OWL_PAREN = re.compile(r"\((\d+),\s*(\d+)\)")
_OWL_BRACKET = re.compile(r"\[(\d+),\s*(\d+)\]")
_FAILURE_CALL = re.compile(r'"action"\s*:\s*"terminate"[^}]*"status"\s*:\s*"fail', re.S)


@dataclass(frozen=True)
class GroundedPoint:
    x: int  # physical pixels of the virtual desktop (pixels of the image for an image file)
    y: int
    model_x: float  # the model's answer on the 0-1000 grid of the whole screenshot, clamped
    model_y: float
    ms: float  # model time, from the question to the whole reply (both passes when zoomed)
    reply: str
    passes: int = 1  # 2 when a zoom-in pass on a crop gave the point
    first: tuple[float, float] | None = None  # the first pass's grid point when zoomed


@dataclass(frozen=True)
class Zoom:
    """When and how to zoom in: `when` is off, always, large (the screenshot has more than
    `above_pixels` pixels) or unsure (`samples` sampled answers spread over more than `spread` grid
    units); the crop is `crop` of each side (a half or a quarter in the published procedures)."""

    when: str = "off"
    crop: float = 0.5
    above_pixels: int = 3_686_400  # 2560x1440
    samples: int = 2
    spread: float = 25.0

    @classmethod
    def from_settings(cls, settings, when: str | None = None) -> Zoom:
        return cls(when=when or settings.zoom, crop=settings.zoom_crop / 100, above_pixels=settings.zoom_above_pixels)


def profile_of(engine: Engine, profile: Profile | None = None) -> Profile:
    return profile or getattr(engine, "profile", None) or DEFAULT


def system_prompt(profile: Profile | None = None) -> str | None:
    """The profile's grounding system prompt (None: the model gets none); Qwen3-VL's by default."""
    profile = profile or DEFAULT
    if profile.system_prompt is None:
        return None
    prompt = prompts.load(profile.system_prompt)
    return prompt.render(**{k: GRID for k in ("screen_width", "screen_height") if k in prompt.placeholders})


def user_text(description: str, profile: Profile | None = None) -> str:
    """The user turn's text for `description`, through the profile's template and quirks."""
    profile = profile or DEFAULT
    if profile.strip_period and description.endswith("."):
        description = description[:-1]
    if profile.user_prompt is None:
        return description
    return prompts.load(profile.user_prompt).render(instruction=description)


def options_for(profile: Profile) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=profile.max_new_tokens, temperature=profile.temperature)


# --- reading replies ----------------------------------------------------------------------------------


def _short(reply: str) -> str:
    return " ".join(reply.split())[:160]


def _no_point(reply: str) -> ParseError:
    return ParseError(f"The model's answer names no point on the screen: {_short(reply)!r}.")


def _tool_call_point(reply: str) -> tuple[float, float]:
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
        raise _no_point(reply)
    return found


def _venus_point(reply: str) -> tuple[float, float]:
    # UI-Venus's `_parse_point`: a whole-reply box, point or two points, else the first bracket's numbers.
    text = reply.strip()
    if m := _BARE_BOX.fullmatch(text):
        x1, y1, x2, y2 = (int(g) for g in m.groups())
        return (x1 + x2) / 2, (y1 + y2) / 2
    if m := _BARE_POINT.fullmatch(text):
        return float(m.group(1)), float(m.group(2))
    if m := _TWO_POINTS.fullmatch(text.replace(" ", "")):
        x1, y1, x2, y2 = (int(g) for g in m.groups())
        return (x1 + x2) / 2, (y1 + y2) / 2
    head = text.split("]")[0]
    if "[" in head:
        parts = head.split("[")[1].split(",")
        if len(parts) >= 2 and all(re.fullmatch(rf"\s*{_INT}\s*", p) for p in parts):
            return float(int(parts[0])), float(int(parts[1]))
    raise _no_point(reply)


def _mai_point(reply: str) -> tuple[float, float]:
    # MAI-UI's `parse_coordinates`: the first [x,y]; the <answer> block first, since the reasoning may quote numbers.
    answer = _ANSWER.search(reply)
    for text in ([answer.group(1)] if answer else []) + [reply]:
        if m := _MAI_POINT.search(text):
            return float(m.group(1)), float(m.group(2))
    raise _no_point(reply)


def _owl_point(reply: str) -> tuple[float, float]:
    # GUI-Owl's evaluation: the LAST (x, y), or failing that the last [x, y].
    matches = _OWL_PAREN.findall(reply) or _OWL_BRACKET.findall(reply)
    if not matches:
        raise _no_point(reply)
    x, y = matches[-1]
    return float(x), float(y)


_PARSERS = {"tool_call": _tool_call_point, "point": _venus_point, "answer": _mai_point, "tool_call_last": _owl_point}


def _refusal(reply: str) -> NotOnScreen:
    return NotOnScreen(f"The model says it is not on the screen (it answered {_short(reply)!r}).")


def point_in_reply(reply: str, profile: Profile | None = None) -> tuple[float, float]:
    """The point a grounding reply names, on the 0-1000 grid (not clamped), read the profile's way.
    NotOnScreen when the reply is the profile's refusal; ParseError when it names no point."""
    profile = profile or DEFAULT
    if not isinstance(reply, str):
        raise _no_point(repr(reply))
    if profile.refusal == "terminate" and _FAILURE_CALL.search(reply) and not _POINT_COORDINATE.search(reply):
        raise _refusal(reply)
    try:
        x, y = _PARSERS[profile.reply_format](reply)
    except (ValueError, OverflowError):  # a number of thousands of digits
        raise _no_point(reply) from None
    if profile.refusal == "[-1,-1]" and (x, y) == (-1, -1):
        raise _refusal(reply)
    if not (math.isfinite(x) and math.isfinite(y)):
        raise _no_point(reply)
    return x * GRID / profile.scale, y * GRID / profile.scale


# --- asking -------------------------------------------------------------------------------------------


def ask(
    engine: Engine,
    shot: Screenshot,
    description: str,
    options: GenerationOptions | None = None,
    profile: Profile | None = None,
) -> tuple[str, float]:
    """The model's whole reply to the grounding question about `shot`, and the ms it took.
    ParseError when the description is empty; engine errors pass through."""
    profile = profile_of(engine, profile)
    description = description.strip()
    if not description:
        raise ParseError('Say what to find, e.g. "the Save button".')
    start = time.perf_counter()
    session = engine.open_session(system=system_prompt(profile))
    session.text_first = profile.text_first
    try:
        reply = session.complete(user_text(description, profile), [shot], options or options_for(profile))
    finally:
        session.close()
    return reply, (time.perf_counter() - start) * 1000


def grounded(reply: str, ms: float, shot: Screenshot, profile: Profile | None = None) -> GroundedPoint:
    """The point a reply names, clamped to the grid and mapped to `shot`'s pixels; NotOnScreen for the
    profile's refusal, ParseError when it names none."""
    mx, my = point_in_reply(reply, profile)
    mx, my = min(max(mx, 0.0), float(GRID)), min(max(my, 0.0), float(GRID))
    x, y = to_pixels(mx, my, shot)
    return GroundedPoint(x, y, mx, my, ms, reply)


def _unsure(engine: Engine, shot: Screenshot, description: str, first: GroundedPoint, zoom: Zoom, profile) -> bool:
    """Whether sampled answers disagree with the first (greedy) one by more than `zoom.spread` grid units."""
    options = GenerationOptions(max_new_tokens=profile.max_new_tokens, temperature=0.7, **sampling_defaults(0.7))
    for _ in range(zoom.samples):
        reply, _ = ask(engine, shot, description, options, profile)
        try:
            x, y = point_in_reply(reply, profile)
        except ParseError:
            return True
        if math.hypot(x - first.model_x, y - first.model_y) > zoom.spread:
            return True
    return False


def wants_zoom(engine, shot: Screenshot, description: str, first: GroundedPoint, zoom: Zoom, profile) -> bool:
    if zoom.when == "always":
        return True
    if zoom.when == "large":
        return shot.width * shot.height > zoom.above_pixels
    if zoom.when == "unsure":
        return _unsure(engine, shot, description, first, zoom, profile)
    return False


def zoom_in(
    engine: Engine, shot: Screenshot, description: str, first: GroundedPoint, zoom: Zoom, profile: Profile | None = None
) -> GroundedPoint:
    """The second pass: the same question on a crop around `first`, its answer in `shot`'s pixels and
    grid. When the crop's answer names no point, the first pass's point stands."""
    profile = profile_of(engine, profile)
    crop = shot.crop(zoom_region(first.model_x, first.model_y, shot, zoom.crop))
    reply, ms = ask(engine, crop, description, profile=profile)
    try:
        found = grounded(reply, ms, crop, profile)
    except ParseError:  # NotOnScreen too: the whole screen showed it, the crop may have cut it
        return GroundedPoint(first.x, first.y, first.model_x, first.model_y, first.ms + ms,
                             first.reply + "\n" + reply, 2, (first.model_x, first.model_y))  # fmt: skip
    mx, my = to_model(found.x, found.y, shot)
    return GroundedPoint(found.x, found.y, mx, my, first.ms + ms, first.reply + "\n" + reply, 2,
                         (first.model_x, first.model_y))  # fmt: skip


def locate(
    engine: Engine,
    shot: Screenshot,
    description: str,
    options: GenerationOptions | None = None,
    zoom: Zoom | None = None,
    profile: Profile | None = None,
) -> GroundedPoint:
    """Ask where `description` is on `shot`; the answer in model and screen coordinates, zoomed in when
    `zoom` says so. NotOnScreen when the model says it is not there, ParseError when the description is
    empty or the reply names no point; engine errors pass through."""
    profile = profile_of(engine, profile)
    first = grounded(*ask(engine, shot, description, options, profile), shot, profile)
    if zoom is None or not wants_zoom(engine, shot, description, first, zoom, profile):
        return first
    return zoom_in(engine, shot, description, first, zoom, profile)


def point_or_click(
    engine: Engine,
    shot: Screenshot,
    description: str,
    options: GenerationOptions | None = None,
    zoom: Zoom | None = None,
) -> tuple[str, tuple[int, int] | None]:
    """Where `description` is on `shot`, asked the grounding way first; when that reply names no point and
    the model speaks computer_use, the agent's own turn ("Click ...") as a second chance. Returns the
    replies and the point in `shot`'s pixels, or None when neither named one (`replay --heal` then stops
    rather than guess)."""
    profile = profile_of(engine)
    reply, ms = ask(engine, shot, description, options, profile)
    try:
        found = grounded(reply, ms, shot, profile)
        if zoom is not None and wants_zoom(engine, shot, description, found, zoom, profile):
            found = zoom_in(engine, shot, description, found, zoom, profile)
            reply = found.reply
        return reply, (found.x, found.y)
    except NotOnScreen:
        return reply, None
    except ParseError:
        pass
    if not profile.drives_agent:
        return reply, None
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
