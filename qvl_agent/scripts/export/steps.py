"""Compiling a browser run's recorded steps into the lines of a Playwright replay (pure: no Playwright).

Each step arrives as the browser executor recorded it: the action's kind, the locator of the element it
acted on, that element's state before and after (`locate.STATE_JS`), the CSS pixel, and for pointer
actions the offset inside the element and whether its centre would hit another target. The rules:

  - act through locators; a pointer step keeps the run's own point (`position=` inside the element) where
    the locator alone would act elsewhere: a double or triple click, a point on anything that is not a
    whole-element control (a text field, a date input, a paragraph, a listbox), or a centre that hits
    another target;
  - a click and typing into a field become one `fill` of the value the field ended with (a date or time
    input's in its ISO form), unless the page listens to key events there or rewrote what was typed: then
    the keys stay keys (`press_sequentially`, `press`);
  - select-all is a real key press: it is folded only into typing that replaces the selection;
  - a `<select>` changed by clicks and keys becomes one `select_option` with every selected option;
  - a tab the run opened is awaited as a popup of the action before it (`page` becomes the new tab), and a
    tab the run went back to is taken up again from the script's `tabs`; the run only goes back when the
    tab it was in closed itself, so the last action there waits for that tab's close event (however late
    it comes, and also when the action itself is cut short by the close);
  - a step that cannot be expressed becomes a loud comment, and its element goes into `lost`, so that the
    end state checks that depend on it are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from qvl_agent.playwright import locate
from qvl_agent.scripts.literals import lit, typed_code
from qvl_agent.secrets import PLACEHOLDER

TEXT_INPUT_TYPES = {"", "text", "email", "password", "search", "tel", "url", "number"}
# Inputs whose value has one canonical form that `fill` takes, whatever keys the run typed into them.
VALUE_INPUT_TYPES = {"date", "time", "datetime-local", "month", "week"}
# Keys that only edit a field's text: their effect is already in the value `fill` writes.
EDITING_KEYS = {"Backspace", "Delete", "ArrowLeft", "ArrowRight", "Home", "End"}
# Select-all matters to a following copy or cut; only typing over the selection makes it redundant.
SELECT_ALL_KEYS = {"Control+a", "Meta+a"}
FOCUS_KEYS = {"Tab", "Shift+Tab"}
SELECT_STEPS = ("open-select", "select-typing", "select")
PENDING_SELECT = ("open-select", "select-typing")
POINTER_KINDS = {"left_click", "right_click", "middle_click", "double_click", "triple_click"}
# Controls where any point acts like any other: a locator's centre click is as good as the run's point.
WHOLE_TAGS = {"button", "a", "summary", "option"}
WHOLE_INPUT_TYPES = {"checkbox", "radio", "button", "submit", "reset", "image", "file", "color"}
WHOLE_ROLES = {
    "button",
    "link",
    "checkbox",
    "radio",
    "switch",
    "tab",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "option",
    "treeitem",
}


def q(text: str) -> str:
    """A Python string literal (double quotes, as the rest of the script); a `{{NAME}}` in it stays text."""
    if not isinstance(text, str):
        return lit(str(text))
    return lit(text)


def python_locator(locator: dict, page: str = "page") -> str | None:
    """Playwright code for a locator dict from `locate`, starting from `page`; None for a point."""
    if locator.get("kind") == "point":
        return None
    try:
        calls = locate.chain(locator)
    except (KeyError, TypeError, ValueError):
        return None
    return _chain_code(page, calls)


def _chain_code(page: str, calls: list) -> str:
    def argument(value) -> str:
        return _chain_code(page, value) if isinstance(value, list) else lit(value)

    code = page
    for method, args, keywords in calls:
        written = [argument(a) for a in args] + [f"{k}={argument(v)}" for k, v in keywords.items()]
        code += f".{method}({', '.join(written)})"
    return code


def target_key(locator: dict | None) -> str:
    """One string per element locator: how ops, final fields and lost elements are matched."""
    return json.dumps(locator, sort_keys=True) if locator else ""


def is_text_field(state: dict | None) -> bool:
    if not state or "checked" in state or state.get("tag") == "select":
        return False
    if state.get("tag") == "input":
        return state.get("type", "") in TEXT_INPUT_TYPES
    return "value" in state  # textarea or contenteditable


def is_value_field(state: dict | None) -> bool:
    return bool(state) and state.get("tag") == "input" and state.get("type", "") in VALUE_INPUT_TYPES


def selection(state: dict | None):
    """What a select shows: the list of selected values of a multi-select, else the value."""
    if not state:
        return None
    return state.get("values") if state.get("multiple") else state.get("value")


def select_option_code(code: str, state: dict) -> str | None:
    """`select_option` reproducing a select's state (every option of a multi-select), or None."""
    if state.get("multiple"):
        labels = state.get("labels")
        return None if labels is None else f"{code}.select_option(label={lit(list(labels))})"
    if state.get("label") is not None:
        return f"{code}.select_option(label={q(state['label'])})"
    return None


@dataclass
class Op:
    """One line (or a few) of the replay, tied to the element it acts on."""

    code: list[str]
    target: str = ""  # target_key(locator)
    kind: str = ""  # "click-field", "fill", "select", ...
    comment: str = ""
    state: dict | None = None  # a pending select's state when it was touched
    select_code: str = ""  # the select's locator code, for a pending select resolved at the end


@dataclass
class StepCompiler:
    """Turns steps into `ops`; `unexpressed` says what the script does not replay faithfully (for the
    person), `lost` which elements' end state it cannot be trusted to reproduce (for the assertions)."""

    ops: list[Op] = field(default_factory=list)
    unexpressed: list[str] = field(default_factory=list)
    lost: set[str] = field(default_factory=set)
    filled: dict[str, str] = field(default_factory=dict)  # target_key -> the expression its last fill wrote
    tab: int = 0  # the tab the steps act in now
    tabs_opened: int = 1
    uses_tabs: bool = False  # the replay keeps a `tabs` list
    tab_start: int = 0  # where the ops of the current tab begin

    def add(self, op: Op) -> None:
        self.ops.append(op)

    def step(self, n: int, kind: str, detail: dict, describe: str, typed: list | None = None) -> None:
        """Add the ops of one step. `typed`: for a `type` step, the run's record of what it typed
        (`Secrets.segments`), which decides where a secret is read; None: the text the trace shows."""
        locator = detail.get("locator")
        code = python_locator(locator) if locator else None
        before, after = detail.get("before"), detail.get("after")
        note = f"step {n}: {describe}"
        if kind in POINTER_KINDS:
            self._pointer(kind, locator, code, before, after, detail, note)
        elif kind == "type":
            self._type(detail.get("text", ""), locator, code, before, after, note, typed)
        elif kind == "key":
            self._key(detail.get("keys", ""), locator, code, before, after, note)
        elif kind in ("scroll", "hscroll"):
            dx, dy = detail.get("wheel", [0, 0])
            lines = []
            if detail.get("pixels"):
                x, y = detail["pixels"][0]
                lines.append(f"page.mouse.move({lit(x)}, {lit(y)})")
            lines.append(f"page.mouse.wheel({lit(dx)}, {lit(dy)})")
            self.add(Op(lines, comment=note + " (locators scroll by themselves; kept for pixel steps)"))
        elif kind == "mouse_move":
            if code:
                position = _position(kind, detail)
                self.add(Op([f"{code}.hover({f'position={position}' if position else ''})"], comment=note))
            else:
                x, y = detail["pixels"][0]
                self.add(Op([f"page.mouse.move({lit(x)}, {lit(y)})"], comment=note))
        elif kind == "left_click_drag":
            self._drag(detail, code, note)
        elif kind == "wait":
            self.add(Op([], comment=note + " (not replayed: locators and expect wait by themselves)"))

    # --- pointer ----------------------------------------------------------------------------------------

    def _pointer(self, kind, locator, code, before, after, detail, note) -> None:
        if code is None:
            x, y = detail["pixels"][0]
            button = {"right_click": "right", "middle_click": "middle"}.get(kind, "left")
            count = {"double_click": 2, "triple_click": 3}.get(kind, 1)
            extra = (f', button="{button}"' if button != "left" else "") + (
                f", click_count={count}" if count > 1 else ""
            )
            self.unexpressed.append(f"{note}: no unique locator, replayed at CSS pixel ({x}, {y})")
            self.add(Op([f"page.mouse.click({lit(x)}, {lit(y)}{extra})"], comment=note + " (no unique locator)"))
            return
        target = target_key(locator)
        if kind == "left_click" and before and "checked" in before and after and "checked" in after:
            if before["checked"] != after["checked"]:
                verb = "check" if after["checked"] else "uncheck"
                self.add(Op([f"{code}.{verb}()"], target, verb, comment=note))
                return
        if kind == "left_click" and before and before.get("tag") == "select":
            if _changed(before, after):
                self._select(locator, code, after, note)
            else:
                # Opening a select's list or moving in it is not a change; choosing comes later (or at the end).
                self._pending_select(locator, code, before, "open-select", note + " (opens the list)")
            return
        args = {
            "left_click": [],
            "right_click": ['button="right"'],
            "middle_click": ['button="middle"'],
            "double_click": [],
            "triple_click": ["click_count=3"],
        }[kind]
        position = _position(kind, detail)
        if position:
            args.append(f"position={position}")
        method = "dblclick" if kind == "double_click" else "click"
        # A click into a text field (selecting its text included) is folded into a `fill` that follows.
        field_click = kind in ("left_click", "double_click", "triple_click") and (
            is_text_field(before) or is_value_field(before)
        )
        line = f"{code}.{method}({', '.join(args)})"
        self.add(Op([line], target, "click-field" if field_click else "click", comment=note))

    def _drag(self, detail, code, note) -> None:
        end = detail.get("end_locator") or {}
        end_code = python_locator(end)
        if code and end_code and len(detail.get("pixels", [])) == 2:
            args = [end_code]
            start = _position("drag", detail)
            end_point = {"offset": detail.get("end_offset"), "element": detail.get("end_element")}
            stop = _position("drag", end_point)
            args += [f"source_position={start}"] if start else []
            args += [f"target_position={stop}"] if stop else []
            self.add(Op([f"{code}.drag_to({', '.join(args)})"], comment=note))
            return
        pixels = detail.get("pixels", [])
        lines = []
        if len(pixels) == 2:
            lines.append(f"page.mouse.move({lit(pixels[0][0])}, {lit(pixels[0][1])})")
        ex, ey = pixels[-1]
        lines += ["page.mouse.down()", f"page.mouse.move({lit(ex)}, {lit(ey)}, steps=10)", "page.mouse.up()"]
        self.unexpressed.append(f"{note}: drag replayed by CSS pixels")
        self.add(Op(lines, comment=note + " (by pixels)"))

    # --- keyboard ---------------------------------------------------------------------------------------

    def _fill(self, locator, code, value_code: str, note: str) -> None:
        target = target_key(locator)
        # Merge with the field's earlier click, select-all and typing: one `fill` with the value it ended with.
        while self.ops and self.ops[-1].target == target and self.ops[-1].kind in ("click-field", "fill", "select-all"):
            self.ops.pop()
        self.add(Op([f"{code}.fill({value_code})"], target, "fill", comment=note))
        self.filled[target] = value_code

    def _type(self, text, locator, code, before, after, note, typed=None) -> None:
        target = target_key(locator)
        typed_expr = typed_code(typed) if typed is not None else q(text)
        if code and before and before.get("tag") == "select":
            self._select_keys(locator, code, before, after, note)
            return
        if code and (is_text_field(before) or is_value_field(before)):
            head, newline, _ = text.partition("\n")
            rewritten = is_text_field(before) and after is not None and head not in (after.get("value") or "")
            if before.get("keys") or rewritten:
                # The page listens to these keys (or rewrote what they typed): replay the keys themselves.
                self.add(Op([f"{code}.press_sequentially({typed_expr})"], target, "keys", comment=note))
            elif is_value_field(before):
                if after and after.get("value"):
                    self._fill(locator, code, q(after["value"]), note)  # the ISO form `fill` takes
                else:  # incomplete or gone: type where the run typed (its click kept its point)
                    self.add(Op([f"page.keyboard.type({typed_expr})"], target, "keys", comment=note))
            else:
                submits = bool(newline) and before.get("tag") == "input"  # Enter in a textarea is just text
                if typed is not None and _built_from_typing(typed, after):
                    # The value the page read back shows a secret (masked), or the typing holds one: build
                    # it from what was there before and what the run typed, never from masked text.
                    kept = typed if after is not None else _head(typed)
                    self._fill(locator, code, typed_code([["text", before.get("value") or ""], *kept]), note)
                elif after is not None:
                    self._fill(locator, code, q(after.get("value", "")), note)
                else:  # the typing submitted the form: the field is gone, so rebuild the value it had
                    self._fill(locator, code, q((before.get("value") or "") + head), note)
                if submits:
                    self.add(Op([f'{code}.press("Enter")'], target, "press", comment=note))
            return
        # The keyboard types into whatever has the focus, without waiting: on a slow machine an editor that
        # takes the focus a moment after its click would miss the text. The run typed once its element had
        # it (its locator is the focused element's), so the replay waits for that too.
        focus = [f"expect({code}).to_be_focused()"] if code else []
        self.add(Op([*focus, f"page.keyboard.type({typed_expr})"], comment=note))

    def _key(self, keys, locator, code, before, after, note) -> None:
        target = target_key(locator)
        if code and before and before.get("tag") == "select":
            self._select_keys(locator, code, before, after, note)
            if keys in FOCUS_KEYS:
                self.add(Op([f"{code}.press({q(keys)})"], target, "press", comment=note + " (moves the focus on)"))
            return
        if code and before and "checked" in before and after and before["checked"] != after.get("checked"):
            verb = "check" if after["checked"] else "uncheck"
            self.add(Op([f"{code}.{verb}()"], target, verb, comment=note))
            return
        fillable = is_text_field(before) or is_value_field(before)
        # An edit becomes a fill of the value it left, unless that value shows a secret (masked): then the
        # key itself is replayed, on the value the earlier steps typed.
        shows_secret = after is not None and PLACEHOLDER.search(str(after.get("value") or ""))
        if code and fillable and not before.get("keys") and keys in EDITING_KEYS and after is not None:
            if not shows_secret:
                self._fill(locator, code, q(after.get("value", "")), note)
                return
        if code:
            kind = "select-all" if fillable and keys in SELECT_ALL_KEYS and not before.get("keys") else "press"
            self.add(Op([f"{code}.press({q(keys)})"], target, kind, comment=note))
        else:
            self.add(Op([f"page.keyboard.press({q(keys)})"], comment=note))

    # --- selects ----------------------------------------------------------------------------------------

    def _pending_select(self, locator, code, state, kind, note) -> None:
        self.add(Op([], target_key(locator), kind, comment=note, state=state, select_code=code))

    def _select_keys(self, locator, code, before, after, note) -> None:
        if after is None:
            self.lose(locator, note, "the list left the page, so what it chose is unknown")
        elif _changed(before, after):
            self._select(locator, code, after, note)
        else:
            # Typing into an open list only moves its highlight; the choice becomes one select_option.
            self._pending_select(locator, code, before, "select-typing", note + " (moves the highlight)")

    def _select(self, locator, code, after, note) -> None:
        target = target_key(locator)
        while self.ops and self.ops[-1].target == target and self.ops[-1].kind in SELECT_STEPS:
            self.ops.pop()
        line = select_option_code(code, after)
        if line is None:
            self.lose(locator, note, "the options it chose were not recorded")
        else:
            self.add(Op([line], target, "select", comment=note))

    def settle_selects(self, final_fields: dict[str, dict]) -> None:
        """A select left with only opening and typing (its choice committed by a later step elsewhere):
        choose what the page ended with, or say loudly that it cannot be replayed."""
        last_kind: dict[str, Op] = {}
        for op in self.ops:
            if op.target:
                last_kind[op.target] = op
        for target, op in last_kind.items():
            if op.kind not in PENDING_SELECT:
                continue
            final = final_fields.get(target)
            if final is None or selection(final) == selection(op.state):
                continue  # unchanged as far as anyone can tell
            line = select_option_code(op.select_code, final)
            if line is None:
                self.lose(json.loads(target), op.comment, "the options it chose were not recorded")
                self.ops[self.ops.index(op)] = self.ops.pop()  # the loud comment where the step was
            else:
                op.code, op.kind = [line], "select"
                op.comment += "; the list ended on this choice"

    # --- tabs -------------------------------------------------------------------------------------------

    def switch_tab(self, tab: int, note: str) -> None:
        """The run went on in tab `tab` (0 the first page, then in the order tabs opened): a tab opened
        since the last step was opened by the last action, so that action waits for the popup and `page`
        becomes it; an older tab is taken up again from `tabs`."""
        if tab == self.tab:
            return
        self.uses_tabs = True
        if tab >= self.tabs_opened:
            self.tabs_opened = tab + 1
            opener = next((op for op in reversed(self.ops) if op.code and op.kind != "lost"), None)
            if opener is None:
                self.lose(None, note, "a tab opened before anything the script does")
                return
            opener.code = [
                "with page.expect_popup() as popup:",
                *(f"    {line}" for line in opener.code),
                "page = popup.value",
                "tabs.append(page)",
            ]
            opener.kind = "popup"  # never folded into a later fill of the same locator in the new tab
        else:
            self._await_close(note)
            self.add(
                Op(
                    [f"page = tabs[{lit(int(tab))}]", "page.bring_to_front()"],
                    comment=f"{note} (back to an earlier tab)",
                )
            )
        self.tab = tab
        self.tab_start = len(self.ops)

    def _await_close(self, note: str) -> None:
        """The executor leaves a tab only when it closes (the model cannot switch tabs): the replay waits for
        the close event of the last action there, so the next step never races a tab that is still closing.
        A close that cuts the action itself short is what the step was meant to do, not a failure."""
        closer = next(
            (op for op in reversed(self.ops[self.tab_start :]) if op.code and op.kind not in ("lost", "popup")), None
        )
        if closer is None:  # nothing done in that tab: it closed by itself
            wait = ["if not page.is_closed():", '    page.wait_for_event("close")']
            self.add(Op(wait, comment=f"{note} (the tab the run was in closed itself)"))
            return
        closer.code = [
            "closing = page",
            "try:",
            '    with closing.expect_event("close"):',
            *(f"        {line}" for line in closer.code),
            "except Error:",
            "    if not closing.is_closed():",
            "        raise",
        ]
        closer.kind = "closes-tab"
        closer.comment += " (its tab closes itself: wait until it has)"

    def lose(self, locator: dict | None, note: str, why: str) -> None:
        """A step the script cannot express: a loud comment, and its element's end state is not checked."""
        self.lost.add(target_key(locator))
        self.unexpressed.append(f"{note}: NOT REPLAYED: {why}")
        self.add(Op([], comment=f"!!! NOT REPLAYED: {note}: {why}; do this step by hand", kind="lost"))


def _built_from_typing(typed: list, after: dict | None) -> bool:
    """Whether a field's new value must come from the typing record: it typed a secret, or the value read
    back from the page holds a placeholder (a secret's value, masked there wherever it appeared)."""
    masked = after is not None and PLACEHOLDER.search(str(after.get("value") or ""))
    return bool(masked) or any(kind == "secret" for kind, _ in typed)


def _head(typed: list) -> list:
    """The typing up to its first line break (what went into a field that Enter then submitted)."""
    kept = []
    for kind, value in typed:
        if kind == "text" and "\n" in value:
            kept.append(["text", value.partition("\n")[0]])
            break
        kept.append([kind, value])
    return kept


def _changed(before: dict | None, after: dict | None) -> bool:
    return bool(before and after and selection(after) != selection(before))


def _position(kind: str, detail: dict) -> str | None:
    """`{"x": .., "y": ..}` for the run's point inside the element, where a centre click would differ."""
    offset, element = detail.get("offset"), detail.get("element") or {}
    box = element.get("box")
    if not offset or not box or not (0 <= offset[0] <= box[2] and 0 <= offset[1] <= box[3]):
        return None  # no point recorded, or the run clicked the element through its label
    whole = (
        element.get("tag") in WHOLE_TAGS
        or (element.get("tag") == "input" and element.get("type") in WHOLE_INPUT_TYPES)
        or (element.get("tag") == "select" and not (detail.get("before") or {}).get("multiple"))
        or element.get("role") in WHOLE_ROLES
    )
    if whole and kind not in ("double_click", "triple_click") and not detail.get("centre_hits_other"):
        return None
    return lit({"x": offset[0], "y": offset[1]})
