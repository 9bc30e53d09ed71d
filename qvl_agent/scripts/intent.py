"""What each step of an exported script meant: the data `qvl-agent replay --heal` reads when a step breaks.

An exported script carries one `# intent: {...}` comment right above each step's code, a JSON object:

    # intent: {"step": 3, "action": "click", "role": "button", "name": "Sign up", "near": "Your name",
    #          "reason": "Submit the form", "point": [412, 318], "locator": {"kind": "role", ...}}

  - `action`: what the step does to its element (click, fill, check, uncheck, select, press, type, hover);
  - `role` / `name`: the element's ARIA role (computed, or implied by its tag) and accessible name;
  - `near`: the nearest text before it in reading order (a caption for elements without a name);
  - `reason`: the model's own words before its tool call, one line; empty when it gave none;
  - `point`: the CSS pixel the run clicked or typed at; `locator`: the locator the step was recorded with;
  - `item`: the text of the repeated item (row, list item, card) the element was found in, when it was;
    `by_position`: true when the element was found by its place alone (nothing on the page named it).

Why a comment per step and not a table at the top: it sits beside the code it describes, so a person who
edits or moves a step keeps its intent with it; the healer finds a failing line's intent by walking up to
the nearest comment (and, for the end-state checks, by the locator); a comment cannot change what the
script does. The JSON is ASCII-only (`ensure_ascii`), so no character in a typed name or label can end the
comment line: a Unicode line separator becomes `\\u2028` inside it. Plain `python` ignores it all.

Pure: no Playwright, no files.
"""

from __future__ import annotations

import json
import re

from qvl_agent.scripts.literals import comment_text

PREFIX = "# intent: "
MAX_TEXT = 120  # names, captions and reasons are cut here: enough to recognise, short enough to read

# The ARIA role an element has by its tag when it names none (as Playwright computes it).
_INPUT_ROLES = {
    "checkbox": "checkbox",
    "radio": "radio",
    "range": "slider",
    "number": "spinbutton",
    "search": "searchbox",
    "button": "button",
    "submit": "button",
    "reset": "button",
    "image": "button",
}
_TAG_ROLES = {"button": "button", "a": "link", "textarea": "textbox", "select": "combobox", "summary": "button"}
# How a step's op kind (steps.Op.kind) reads as an action.
_ACTIONS = {
    "click-field": "click",
    "popup": "click",
    "keys": "type",
    "select-all": "press",
    "open-select": "select",
    "select-typing": "select",
}
_TOOL_CALL = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.S)


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def implicit_role(element: dict) -> str:
    """The ARIA role of a recorded element (`locate` element dict): its own role attribute, else its tag's."""
    if element.get("role"):
        return str(element["role"]).split()[0]
    tag = element.get("tag", "")
    if tag == "input":
        return _INPUT_ROLES.get(element.get("type", ""), "textbox")
    return _TAG_ROLES.get(tag, "")


def reason_of(reply: str) -> str:
    """The model's own words around its tool call, one line: why it took the step (empty when none)."""
    text = _TOOL_CALL.sub(" ", reply or "")
    for line in text.splitlines():
        line = line.strip().removeprefix("Action:").removeprefix("Thought:").strip()
        if line:
            return _short(line)
    return ""


def step_intent(n: int, action: str, detail: dict, reason: str = "") -> dict:
    """The intent of step `n` from what the browser executor recorded (`detail`)."""
    locator = dict(detail.get("locator") or {})
    element = detail.get("element") or {}
    own = locator.get("inner") or {} if locator.get("kind") == "within" else locator
    role = own.get("role") if own.get("kind") == "role" else implicit_role(element)
    name = own.get("name") or own.get("text") or element.get("text") or ""
    intent: dict = {"step": n, "action": _ACTIONS.get(action, action)}
    if role:
        intent["role"] = role
    if name:
        intent["name"] = _short(name)
    if locator.get("kind") == "within":
        intent["item"] = _short(locator.get("has_text", ""))
    elif locator.get("kind") == "css":
        intent["by_position"] = True  # nothing on the page named it: its place is all the script knows
    if element.get("near"):
        intent["near"] = _short(element["near"])
    if reason:
        intent["reason"] = _short(reason)
    if detail.get("pixels"):
        x, y = detail["pixels"][0]
        intent["point"] = [round(x), round(y)]
    if locator and locator.get("kind") != "point":
        intent["locator"] = locator
    return intent


def op_action(kind: str) -> str:
    """How an exported op's kind (`steps.Op.kind`) reads as the step's action."""
    return _ACTIONS.get(kind, kind)


def comment(intent: dict) -> str:
    """The `# intent:` line for a step: ASCII-only JSON, so nothing in it can end the comment."""
    return comment_text(PREFIX + json.dumps(intent, ensure_ascii=True))  # the exporter's one comment builder


def parse(line: str) -> dict | None:
    """The intent of one source line, or None when it is not an intent comment (or not a valid one)."""
    text = line.strip()
    if not text.startswith(PREFIX.strip()):
        return None
    try:
        found = json.loads(text[len(PREFIX.strip()) :])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


_NOUNS = {
    "button": "button",
    "link": "link",
    "textbox": "text field",
    "searchbox": "search field",
    "spinbutton": "number field",
    "checkbox": "checkbox",
    "radio": "radio button",
    "combobox": "drop-down list",
    "listbox": "list",
    "option": "option",
    "slider": "slider",
    "tab": "tab",
    "menuitem": "menu item",
}


def describe(intent: dict, many: bool = False) -> str:
    """The step's target in words, for the grounding question: 'the "Sign up" button', 'the text field after
    "Quantity"'. The reason, when the run recorded one, follows in parentheses. `many`: the page now has
    several elements of that name, so the caption is what tells the step's own apart."""
    role, name, near = intent.get("role", ""), intent.get("name", ""), intent.get("near", "")
    noun = _NOUNS.get(role, role or "element")
    text = f'the "{name}" {noun}' if name else f"the {noun}"
    if intent.get("item"):  # the row, list item or card that holds it, by its own text
        text += f' in the item that says "{intent["item"]}"'
    # A name found by its place (a CSS path) is not unique on the page: its caption tells it apart.
    elif near and near != name and (many or not name or (intent.get("locator") or {}).get("kind") == "css"):
        text += f' after "{near}"'
    if intent.get("reason"):
        text += f" ({intent['reason']})"
    return text
