"""Each step a person recorded (`qvl-agent record --describe`), said in words by the model from its screenshot.

The words become the step's `reason` in the exported script's `# intent:` line, which is what
`replay --heal` reads when the step breaks: "Cancel order #1002" asks a better question than the locator
alone. The model sees the screenshot the recorder took before the step and the step as the recorder
describes it (the element's role and name, the point); it is asked after the recording, never while the
person works. What it says is masked with the recording's secrets and cut to one line. A step without a
screenshot, or a reply without words, keeps no reason. Imports no torch, Qt or Playwright.

`describe_person_steps` says without a model what the person did while they held a run (desktop or browser),
in one observation for the model when they hand it back: points on the model's 0-1000 grid, as the model's
own observations give them, and private typing never spelled out.
"""

from __future__ import annotations

from pathlib import Path

from qvl_agent import actions as A
from qvl_agent import prompts
from qvl_agent.act.keys import PLAYWRIGHT
from qvl_agent.engine.base import Engine, GenerationOptions
from qvl_agent.errors import InputError
from qvl_agent.image import load_image
from qvl_agent.secrets import PLACEHOLDER, Secrets
from qvl_agent.trace import Trace

MAX_WORDS = 120  # characters: one line of intent
OPTIONS = GenerationOptions(max_new_tokens=48)


def question(record: dict) -> str:
    """What the model is asked about one recorded step."""
    result = (record.get("results") or [{}])[0]
    action = (record.get("actions") or [{}])[0]
    point = action.get("coordinate")
    where = f" (at {point[0]}, {point[1]} on a 1000x1000 grid over the screenshot)" if point else ""
    return prompts.load("record_intent").render(action=str(result.get("action", "")), point=where)


def one_line(reply: str) -> str:
    for line in reply.splitlines():
        line = line.strip().strip('"').strip()
        if line:
            return line if len(line) <= MAX_WORDS else line[: MAX_WORDS - 1] + "…"
    return ""


def describe_steps(engine: Engine, trace: Trace, secrets: Secrets) -> dict[int, str]:
    """{step number: the step's intent in words} for the person's steps of `trace`."""
    words: dict[int, str] = {}
    for record in trace.steps:
        name = record.get("screenshot")
        if record.get("by") != "person" or not isinstance(name, str) or Path(name).name != name:
            continue
        try:
            shot = load_image(trace.dir / name)
        except InputError:
            continue  # a picture that is missing or damaged: that step goes without words
        session = engine.open_session()
        try:
            said = one_line(secrets.mask(session.complete(question(record), [shot], OPTIONS)))
        finally:
            session.close()
        if said:
            words[record["step"]] = said
    return words


# --- what the person did, in one observation ----------------------------------------------------------------

MAX_PERSON_STEPS = 30  # past this many, the observation counts the rest
MAX_TYPED = 200  # characters of typed text quoted
CLICKED = {"left_click": "clicked", "right_click": "right-clicked", "middle_click": "middle-clicked",
           "double_click": "double-clicked", "triple_click": "triple-clicked"}  # fmt: skip
# The browser recorder's words (`act.recorder.describe`) start with a verb in the present tense.
BROWSER_VERBS = (("double-click", "double-clicked"), ("triple-click", "triple-clicked"),
                 ("right click", "right-clicked"), ("middle click", "middle-clicked"), ("click", "clicked"),
                 ("press", "pressed"), ("choose", "chose"), ("type", "typed"))  # fmt: skip
KEY_LABELS = {"ctrl": "Ctrl", "alt": "Alt", "win": "Super", "esc": "Escape", "pageup": "Page Up",
              "pagedown": "Page Down", "backspace": "Backspace", "delete": "Delete"}  # fmt: skip


def describe_person_steps(steps: list[dict]) -> str:
    """What the person did, in one sentence: "The person clicked at (412, 300) on the screen; typed 'hello';
    pressed Enter." Private typing (a secret's placeholder) is "typed something private"."""
    parts = [part for part in map(person_step, steps) if part]
    if not parts:
        return "The person did nothing the run could record."
    if len(parts) > MAX_PERSON_STEPS:
        rest = len(parts) - MAX_PERSON_STEPS
        parts = [*parts[:MAX_PERSON_STEPS], f"and {rest} more step{'s' * (rest != 1)}"]
    return A.printable("The person " + "; ".join(parts) + ".")


def person_step(record: dict) -> str:
    """One step of the person's in words, starting with its verb in the past ("clicked at (412, 300) on the
    screen"); "" for a record that is not one."""
    action = next(iter(record.get("actions") or []), {})
    result = next(iter(record.get("results") or []), {})
    if not isinstance(action, dict) or not isinstance(result, dict):
        return ""
    kind, words = str(action.get("action", "")), str(result.get("action", ""))
    detail = result.get("detail") if isinstance(result.get("detail"), dict) else {}
    browser = "url" in detail or "locator" in detail
    if kind == "type":
        typed = _typed(str(action.get("text", detail.get("text", ""))), bool(detail.get("private")))
        target = words.partition(" ")[2] if browser and words.startswith("type ") else ""
        return f"typed {typed} {target}".strip()
    if browser:
        return next((past + words[len(verb) :] for verb, past in BROWSER_VERBS if words.startswith(verb + " ")),
                    f"did this: {words}")  # fmt: skip
    return _desktop_step(kind, action, words)


def _desktop_step(kind: str, action: dict, words: str) -> str:
    point = _point(action.get("coordinate"))
    if kind == "key":
        return "pressed " + "+".join(_key_label(str(k)) for k in action.get("keys") or [])
    if point is None:  # off the monitor the run watches: the recorder's words give the pixel
        where = words.partition(" ")[2]
        return f"{CLICKED[kind]} {where}, off the screenshot" if kind in CLICKED else f"did this: {words}"
    if kind in CLICKED:
        return f"{CLICKED[kind]} at {point} on the screen"
    if kind == "left_click_drag":
        start = _point(action.get("start_coordinate"))
        return f"dragged from {start} to {point}" if start else f"dragged to {point}"
    if kind in ("scroll", "hscroll"):
        amount = action.get("pixels") or 0
        way = ("up" if amount > 0 else "down") if kind == "scroll" else ("right" if amount > 0 else "left")
        clicks = abs(amount)
        return f"scrolled {way} {clicks:g} wheel click{'s' * (clicks != 1)} at {point}"
    return f"did this: {words}"


def _typed(text: str, private: bool) -> str:
    if private or PLACEHOLDER.search(text):
        return "something private"
    if len(text) > MAX_TYPED:
        text = text[: MAX_TYPED - 1] + "…"
    return repr(text)


def _point(value) -> str | None:
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
        return f"({value[0]:g}, {value[1]:g})"
    return None


def _key_label(key: str) -> str:
    """A key as people read it: "enter" -> "Enter", "ctrl" -> "Ctrl", "c" -> "C"."""
    if len(key) == 1:
        return key.upper()
    return KEY_LABELS.get(key.lower(), PLAYWRIGHT.get(key.lower(), key.capitalize()))
