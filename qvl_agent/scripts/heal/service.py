"""Healing a replay, the side outside the sandbox: the model answers the hook's questions; every heal is kept.

`HealService(ask, path)` listens on a unix socket that `replay --heal` binds into the sandbox, where
`hook_in_sandbox.py` wraps the script's Playwright calls. For each step that broke, the hook sends the step's
intent and a screenshot of the page; this side asks the model where that element is now (`ask`, in
practice `grounding.point_or_click`: Qwen3-VL's official grounding form, the ScreenSpot adapter's
`left_click` question with the step's intent in words, and the agent's own computer-use turn when that
reply names no point). A page covered by something new (a cookie banner intercepting the click) gets the question "close
what covers the page" instead. The point goes back in CSS pixels; the hook resolves it to an element and a
locator and says what it found. A found element of another role than the intent's, or no element at all,
stops the replay here with one sentence; otherwise the heal is recorded: the failing locator, the
screenshot with the point, the new locator, the model's time and the whole heal's time.

Everything from inside is untrusted: one line at a time, bounded (`MAX_LINE`), at most `MAX_HEALS` heals,
a screenshot decoded under the pixel limit, a locator accepted only as one of the known kinds with text
fields. The healed script is written from these records by `rewrite`, never from the hook's text.
"""

from __future__ import annotations

import base64
import binascii
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.errors import QvlError
from qvl_agent.image import Screenshot, load_image_bytes, to_model
from qvl_agent.scripts.intent import describe

MAX_HEALS = 20  # a script that breaks more often than this has changed too much to heal step by step
MAX_LINE = 24 << 20  # one message: a viewport PNG as base64 fits many times over
MAX_PIXELS = 16_777_216
MAX_TEXT = 500
# The locator kinds `locate.py` makes, and the text fields each one has.
LOCATOR_FIELDS = {
    "role": ("role", "name"),
    "label": ("text",),
    "placeholder": ("text",),
    "testid": ("value",),
    "text": ("text",),
    "css": ("selector",),
}
COVER_QUESTION = "the button that accepts or closes the box covering the page"


@dataclass
class Heal:
    """One healed step, or one the model could not heal (`problem`)."""

    step: int | None  # the step number in the script's intent, when it has one
    kind: str  # "locate": the locator found nothing or several; "cover": something covered the target
    description: str  # what the model was asked
    failing: str  # the failing locator, as Playwright writes its selector
    error: str  # why it failed, one line
    where: dict  # line, end_line, end_col, method: the call in the script
    shot: Screenshot | None = field(default=None, repr=False)
    reply: str = ""
    point: tuple[float, float] | None = None  # CSS pixels of the page
    locator: dict | None = None  # the new locator
    role: str = ""
    problem: str = ""  # why the found element does not fit the step; the replay stopped on it
    model_ms: float = 0.0
    total_ms: float = 0.0  # screenshot, question, answer, resolving the element: the whole pause
    reused: bool = False  # the same locator, healed earlier in the run, used again without asking


# The model's side: (screenshot, what to find) -> (its whole reply, the point in the screenshot's pixels or
# None). `grounding.point_or_click` on an engine; this package does not talk to engines itself.
Asker = Callable[[Screenshot, str], tuple[str, "tuple[float, float] | None"]]


def _text(value, limit: int = MAX_TEXT) -> str:
    return str(value)[:limit] if isinstance(value, str | int | float) else ""


def clean_locator(value, inner: bool = False) -> dict | None:
    """A locator dict from inside, accepted only in the shape `locate.py` makes; None otherwise."""
    if isinstance(value, dict) and value.get("kind") == "within" and not inner:
        found = clean_locator({"kind": "css", "selector": value.get("item")}, inner=True)
        has = clean_locator({"kind": "text", "text": value.get("has_text")}, inner=True)
        held = clean_locator(value.get("inner"), inner=True)
        if found and has and held:
            return {"kind": "within", "item": found["selector"], "has_text": has["text"], "inner": held}
        return None
    if not isinstance(value, dict) or value.get("kind") not in LOCATOR_FIELDS:
        return None
    fields = LOCATOR_FIELDS[value["kind"]]
    if not all(isinstance(value.get(f), str) and 0 < len(value[f]) <= MAX_TEXT for f in fields):
        return None
    return {"kind": value["kind"], **{f: value[f] for f in fields}}


def clean_intent(value) -> dict:
    """The intent fields the question is built from, as short text (a script's comment is untrusted)."""
    if not isinstance(value, dict):
        return {}
    out = {k: _text(value[k], 200) for k in ("action", "role", "name", "near", "reason") if k in value}
    if isinstance(value.get("step"), int) and not isinstance(value.get("step"), bool):
        out["step"] = value["step"]
    if isinstance(value.get("locator"), dict) and value["locator"].get("kind") in (*LOCATOR_FIELDS, "within"):
        out["locator"] = {"kind": value["locator"]["kind"]}
    if "item" in value:
        out["item"] = _text(value["item"], 200)
    return {k: v for k, v in out.items() if v != ""}  # type: ignore[misc]


def clean_where(value) -> dict:
    if not isinstance(value, dict):
        return {}
    out = {k: value[k] for k in ("line", "end_line", "end_col") if type(value.get(k)) is int and 0 <= value[k] < 10**7}
    if isinstance(value.get("method"), str) and value["method"].isidentifier():
        out["method"] = value["method"][:40]
    return out


class HealService:
    """The model behind the hook: answers over a unix socket, keeps `heals`, and `stopped` (the sentence
    a step that could not be healed stopped the replay with)."""

    def __init__(self, ask: Asker, path: Path):
        self.ask = ask
        self.path = path
        self.heals: list[Heal] = []
        self.stopped = ""
        self.questions = 0  # the model's turns so far: bounded too, whatever the sandbox says back
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(4)
        self._thread = threading.Thread(target=self._serve, name="qvl-heal", daemon=True)
        self._closed = False

    def start(self) -> HealService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self._talk(conn)

    def _talk(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        pending: Heal | None = None
        while True:
            line = reader.readline(MAX_LINE + 1)
            if not line or len(line) > MAX_LINE:
                return
            try:
                message = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                return
            if not isinstance(message, dict):
                return
            kind = message.get("type")
            if kind == "heal":
                pending, answer = self._question(message)
            elif kind == "resolved" and pending is not None:
                answer = self._resolved(pending, message)
                pending = None
            elif kind == "reused":
                answer = self._reused(message)
            else:
                return
            try:
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except OSError:
                return

    def _stop(self, sentence: str) -> dict:
        self.stopped = self.stopped or sentence
        return {"stop": sentence}

    def _question(self, message: dict) -> tuple[Heal | None, dict]:
        intent = clean_intent(message.get("intent"))
        kind = "cover" if message.get("kind") == "cover" else "locate"
        error = _text(message.get("error"))
        heal = Heal(
            intent.get("step"), kind, describe(intent, many="strict mode violation" in error),
            _text(message.get("failing")), error, clean_where(message.get("where")),
        )  # fmt: skip
        self.questions += 1
        if len([h for h in self.heals if not h.reused]) >= MAX_HEALS or self.questions > 3 * MAX_HEALS:
            return None, self._stop(
                f"More than {MAX_HEALS} steps broke: the page changed too much to heal step by step."
            )
        try:
            png = base64.b64decode(str(message.get("png", "")), validate=True)
            heal.shot = load_image_bytes(png, max_pixels=MAX_PIXELS, name="page screenshot")
        except (binascii.Error, ValueError, QvlError) as exc:
            return None, self._stop(f"The replay sent no usable screenshot ({exc}).")
        question = heal.description if kind == "locate" else COVER_QUESTION
        started = time.perf_counter()
        try:
            heal.reply, point = self.ask(heal.shot, question)
        except QvlError as exc:
            return None, self._stop(f"{_step_name(heal)} was not healed: the model could not be asked ({exc}).")
        heal.model_ms = (time.perf_counter() - started) * 1000
        if point is None:
            heal.problem = "the model named no point on the page"
            self.heals.append(heal)
            return None, self._stop(f"{_step_name(heal)} was not healed: {heal.problem}; the replay stops here.")
        heal.point = point
        return heal, {"point": list(point)}

    def _resolved(self, heal: Heal, message: dict) -> dict:
        heal.locator = clean_locator(message.get("locator"))
        heal.role = _text(message.get("role"), 40)
        ms = message.get("ms")
        heal.total_ms = float(ms) if isinstance(ms, int | float) and 0 <= ms < 1e7 else heal.model_ms
        heal.total_ms = max(heal.total_ms, heal.model_ms)
        problem = _text(message.get("problem"), 200)
        if message.get("covered") is True and heal.kind == "locate" and problem:
            # The model found the step's element under a layer over the page: close the layer first. Not a
            # heal yet: the step is asked about again once the layer is gone.
            return {"cover": True}
        self.heals.append(heal)
        x, y = heal.point or (0, 0)
        if problem or heal.locator is None:
            heal.problem = problem or "no locator names the element there"
            return self._stop(
                f"{_step_name(heal)} was not healed: the model pointed at ({x:.0f}, {y:.0f}), and {heal.problem}; "
                "the replay stops here rather than guess."
            )
        return {"go": True}

    def _reused(self, message: dict) -> dict:
        """A locator healed earlier, used again (the end-state checks): written into the healed script too."""
        failing = _text(message.get("failing"))
        first = next((h for h in self.heals if h.failing == failing and h.locator and not h.reused), None)
        if first is None:
            return self._stop("The replay reused a heal this side does not know of; it stops here.")
        reuse = Heal(first.step, "locate", first.description, failing, "", clean_where(message.get("where")))
        reuse.locator, reuse.role, reuse.reused = first.locator, first.role, True
        self.heals.append(reuse)
        return {"go": True}


def _step_name(heal: Heal) -> str:
    head = f"Step {heal.step}" if heal.step is not None else f"The step on line {heal.where.get('line', '?')}"
    return f"{head} ({heal.description})" if heal.kind == "locate" else f"{head} (something covers the page)"


def model_point(heal: Heal) -> tuple[float, float] | None:
    """The heal's point on the model's 0-1000 grid (for the report's marker)."""
    if heal.point is None or heal.shot is None:
        return None
    return to_model(heal.point[0], heal.point[1], heal.shot)
