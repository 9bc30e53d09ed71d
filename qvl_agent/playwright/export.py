"""Compiling a finished browser run into a standalone Playwright script that replays it without the model.

Input: the run's steps as the trace holds them (each step's action and the `detail` the browser executor
recorded: the locator of the element acted on, its state before and after, the page URL) and, when the
run left one, the final state the executor checked in the live page (`final.json`). Output: Python source
using Playwright's sync API, importing nothing from qvl_agent, that

  - opens the start URL (`--url` overrides it; recorded URLs on the same origin follow the override),
  - acts through locators: a click then typing into a field becomes `fill`, a checkbox click `check` /
    `uncheck`, a select whose value changed `select_option`, other clicks `click`; only a click whose
    element had no unique locator falls back to the recorded CSS pixel,
  - waits the way Playwright recommends: auto-waiting locator actions and `expect(page).to_have_url`
    after a step that navigated, never fixed sleeps,
  - ends with `expect` assertions on the final state: values of fields, checked states, the URL, and
    text that appeared after the last click.

The script reads the browser executable from `--browser PATH` or `$QVL_BROWSER`, else Playwright's own.
This module is pure: no Playwright, no browser, no file system except `export_run`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.actions import printable
from qvl_agent.playwright import secret_refs
from qvl_agent.playwright.flags import CHROMIUM_ARGS

# Chromium flags the exported script passes (the same as the executor's): no network calls of its own.
SCRIPT_CHROMIUM_ARGS = list(CHROMIUM_ARGS)
TEXT_INPUT_TYPES = {"", "text", "email", "password", "search", "tel", "url", "number"}
# Keys that only edit a field's text: their effect is already in the value `fill` writes.
EDITING_KEYS = {"Backspace", "Delete", "ArrowLeft", "ArrowRight", "Home", "End", "Control+a", "Meta+a"}
SELECT_STEPS = ("open-select", "select-typing", "select")
POINTER_KINDS = {"left_click", "right_click", "middle_click", "double_click", "triple_click"}


def q(text: str) -> str:
    """A Python string literal (double quotes, as the rest of the script)."""
    return json.dumps(text, ensure_ascii=False)


def python_locator(locator: dict) -> str | None:
    """Playwright code for a locator dict from `act.locate`; None for a point."""
    kind = locator.get("kind")
    if kind == "role":
        return f"page.get_by_role({q(locator['role'])}, name={q(locator['name'])}, exact=True)"
    if kind == "label":
        return f"page.get_by_label({q(locator['text'])}, exact=True)"
    if kind == "placeholder":
        return f"page.get_by_placeholder({q(locator['text'])}, exact=True)"
    if kind == "testid":
        return f"page.get_by_test_id({q(locator['value'])})"
    if kind == "text":
        return f"page.get_by_text({q(locator['text'])}, exact=True)"
    if kind == "css":
        return f"page.locator({q(locator['selector'])})"
    return None


def _is_text_field(state: dict | None) -> bool:
    if not state or "checked" in state or state.get("tag") == "select":
        return False
    if state.get("tag") == "input":
        return state.get("type", "") in TEXT_INPUT_TYPES
    return "value" in state  # textarea or contenteditable


def _key_of(locator: dict | None) -> str:
    return json.dumps(locator, sort_keys=True) if locator else ""


@dataclass
class _Op:
    """One line (or a few) of the replay, tied to the element it acts on."""

    code: list[str]
    target: str = ""  # _key_of(locator)
    kind: str = ""  # "click-field", "fill", ...
    fill_value: str = ""
    comment: str = ""
    url_after: str = ""


@dataclass
class Compiled:
    source: str
    unexpressed: list[str] = field(default_factory=list)  # steps the script could not express faithfully


class _Compiler:
    def __init__(self, start_url: str):
        self.start_url = start_url
        self.origin = _origin(start_url)
        self.ops: list[_Op] = []
        self.unexpressed: list[str] = []

    def url_expr(self, url: str) -> str:
        if self.origin and url.startswith(self.origin):
            return f"origin + {q(url[len(self.origin) :])}"
        return q(url)

    def add(self, op: _Op) -> None:
        self.ops.append(op)

    def step(self, n: int, kind: str, detail: dict, describe: str) -> None:
        locator = detail.get("locator")
        code = python_locator(locator) if locator else None
        before, after = detail.get("before"), detail.get("after")
        note = f"step {n}: {describe}"
        if kind in POINTER_KINDS:
            self._pointer(kind, locator, code, before, after, detail, note)
        elif kind == "type":
            self._type(detail.get("text", ""), locator, code, before, after, note)
        elif kind == "key":
            self._key(detail.get("keys", ""), locator, code, before, after, note)
        elif kind in ("scroll", "hscroll"):
            dx, dy = detail.get("wheel", [0, 0])
            lines = []
            if detail.get("pixels"):
                x, y = detail["pixels"][0]
                lines.append(f"page.mouse.move({x}, {y})")
            lines.append(f"page.mouse.wheel({dx}, {dy})")
            self.add(_Op(lines, comment=note + " (locators scroll by themselves; kept for pixel steps)"))
        elif kind == "mouse_move":
            if code:
                self.add(_Op([f"{code}.hover()"], comment=note))
            else:
                x, y = detail["pixels"][0]
                self.add(_Op([f"page.mouse.move({x}, {y})"], comment=note))
        elif kind == "left_click_drag":
            self._drag(detail, code, note)
        elif kind == "wait":
            self.add(_Op([], comment=note + " (not replayed: locators and expect wait by themselves)"))

    def _pointer(self, kind, locator, code, before, after, detail, note) -> None:
        if code is None:
            x, y = detail["pixels"][0]
            button = {"right_click": "right", "middle_click": "middle"}.get(kind, "left")
            count = {"double_click": 2, "triple_click": 3}.get(kind, 1)
            extra = (f', button="{button}"' if button != "left" else "") + (
                f", click_count={count}" if count > 1 else ""
            )
            self.unexpressed.append(f"{note}: no unique locator, replayed at CSS pixel ({x}, {y})")
            self.add(_Op([f"page.mouse.click({x}, {y}{extra})"], comment=note + " (no unique locator)"))
            return
        target = _key_of(locator)
        if kind == "left_click" and before and "checked" in before and after and "checked" in after:
            if before["checked"] != after["checked"]:
                verb = "check" if after["checked"] else "uncheck"
                self.add(_Op([f"{code}.{verb}()"], target, verb, comment=note))
                return
        if kind == "left_click" and before and before.get("tag") == "select":
            if _changed(before, after):
                self._select(locator, code, after, note)
            else:
                # Opening a select's popup is not a state change; choosing the option is, and comes later.
                self.add(_Op([], target, "open-select", comment=note + " (opens the list)"))
            return
        method = {
            "left_click": "click()",
            "right_click": 'click(button="right")',
            "middle_click": 'click(button="middle")',
            "double_click": "dblclick()",
            "triple_click": "click(click_count=3)",
        }[kind]
        # A click into a text field (selecting its text included) is folded into a `fill` that follows.
        field_click = kind in ("left_click", "double_click", "triple_click") and _is_text_field(before)
        self.add(_Op([f"{code}.{method}"], target, "click-field" if field_click else "click", comment=note))

    def _fill(self, locator, code, value: str, note: str) -> None:
        target = _key_of(locator)
        # Merge with the field's earlier click and typing: one `fill` with the value the field ended with.
        while self.ops and self.ops[-1].target == target and self.ops[-1].kind in ("click-field", "fill"):
            self.ops.pop()
        self.add(_Op([f"{code}.fill({q(value)})"], target, "fill", fill_value=value, comment=note))

    def _type(self, text, locator, code, before, after, note) -> None:
        if code and _is_text_field(before):
            head, newline, _ = text.partition("\n")
            submits = bool(newline) and before.get("tag") == "input"  # Enter in a textarea is just text
            if after is not None:
                self._fill(locator, code, after.get("value", ""), note)
            else:  # the typing submitted the form: the field is gone, so rebuild the value it had
                self._fill(locator, code, (before.get("value") or "") + head, note)
            if submits:
                self.add(_Op([f'{code}.press("Enter")'], _key_of(locator), "press", comment=note))
            return
        if code and before and before.get("tag") == "select":
            self._select_keys(locator, code, before, after, note)
            return
        self.add(_Op([f"page.keyboard.type({q(text)})"], comment=note))

    def _select_keys(self, locator, code, before, after, note) -> None:
        if _changed(before, after):
            self._select(locator, code, after, note)
        else:
            # Typing into an open list only moves its highlight; the choice becomes one select_option.
            self.add(_Op([], _key_of(locator), "select-typing", comment=note + " (moves the highlight)"))

    def _select(self, locator, code, after, note) -> None:
        target = _key_of(locator)
        while self.ops and self.ops[-1].target == target and self.ops[-1].kind in SELECT_STEPS:
            self.ops.pop()
        option = q(after.get("label", ""))
        self.add(_Op([f"{code}.select_option(label={option})"], target, "select", comment=note))

    def _key(self, keys, locator, code, before, after, note) -> None:
        if code and _is_text_field(before) and keys in EDITING_KEYS and after is not None:
            self._fill(locator, code, after.get("value", ""), note)
            return
        if code and before and before.get("tag") == "select" and keys != "Tab":
            self._select_keys(locator, code, before, after, note)
            return
        if code and before and "checked" in before and after and before["checked"] != after.get("checked"):
            verb = "check" if after["checked"] else "uncheck"
            self.add(_Op([f"{code}.{verb}()"], _key_of(locator), verb, comment=note))
            return
        if code:
            self.add(_Op([f"{code}.press({q(keys)})"], _key_of(locator), "press", comment=note))
        else:
            self.add(_Op([f"page.keyboard.press({q(keys)})"], comment=note))

    def _drag(self, detail, code, note) -> None:
        end = detail.get("end_locator") or {}
        end_code = python_locator(end)
        if code and end_code and len(detail.get("pixels", [])) == 2:
            self.add(_Op([f"{code}.drag_to({end_code})"], comment=note))
            return
        pixels = detail.get("pixels", [])
        lines = []
        if len(pixels) == 2:
            lines.append(f"page.mouse.move({pixels[0][0]}, {pixels[0][1]})")
        ex, ey = pixels[-1]
        lines += ["page.mouse.down()", f"page.mouse.move({ex}, {ey}, steps=10)", "page.mouse.up()"]
        self.unexpressed.append(f"{note}: drag replayed by CSS pixels")
        self.add(_Op(lines, comment=note + " (by pixels)"))


def _changed(before: dict | None, after: dict | None) -> bool:
    return bool(before and after and after.get("value") != before.get("value"))


def _origin(url: str) -> str:
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", url)
    return m.group(0) if m else ""


def _assertions(compiler: _Compiler, final: dict | None, last_url: str) -> list[str]:
    lines = []
    url = (final or {}).get("url") or last_url
    if url and not url.startswith(("chrome-error:", "about:")):
        lines.append(f"expect(page).to_have_url({compiler.url_expr(url)})")
    for item in (final or {}).get("fields", []):
        code, state = python_locator(item["locator"]), item["state"]
        if code is None:
            continue
        if "checked" in state:
            lines.append(f"expect({code}).{'to_be_checked' if state['checked'] else 'not_to_be_checked'}()")
        elif "value" in state:
            lines.append(f"expect({code}).to_have_value({q(state['value'])})")
    for text in (final or {}).get("new_text", []):
        lines.append(f"expect(page.get_by_text({q(text)}, exact=True)).to_be_visible()")
    return lines


_TEMPLATE = '''#!/usr/bin/env python3
"""Replays a browser run recorded by qvl-agent, without the model: {title}

Task: {task}
Run:  python {filename} [--browser PATH] [--url URL] [--headed] [--timeout SECONDS]
      (the browser comes from --browser, else $QVL_BROWSER, else Playwright's own Chromium)
Exit status 0 when the page reaches the recorded end state, 1 when it does not.
"""

import argparse
import os
import re
import sys

from playwright.sync_api import Error, expect, sync_playwright

START_URL = {start_url}
VIEWPORT = {{"width": {width}, "height": {height}}}
CHROMIUM_ARGS = {chromium_args}


def replay(page, origin):
{body}


def main():
    parser = argparse.ArgumentParser(description="Replay a recorded browser run.")
    parser.add_argument("--browser", default=os.environ.get("QVL_BROWSER"), help="Chromium executable")
    parser.add_argument("--url", default=START_URL, help="start URL (default: the recorded one)")
    parser.add_argument("--headed", action="store_true", help="show the browser window")
    parser.add_argument("--timeout", type=float, default=10, help="seconds each step may wait (default 10)")
    args = parser.parse_args()
    origin = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", args.url).group(0)
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=args.browser or None, headless=not args.headed,
                                        args=CHROMIUM_ARGS)
        except Error as exc:
            if "doesn't exist" in str(exc):
                print("No Chromium found: pass --browser PATH or set QVL_BROWSER.", file=sys.stderr)
            else:
                print("Chromium did not start: " + str(exc).strip().splitlines()[0], file=sys.stderr)
            return 1
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(args.timeout * 1000)
            expect.set_options(timeout=args.timeout * 1000)
            page.on("dialog", lambda dialog: dialog.accept())
            page.goto(args.url)
            replay(page, origin)
        except (AssertionError, Error) as exc:
            print("Replay failed: " + str(exc).strip().splitlines()[0], file=sys.stderr)
            return 1
        finally:
            browser.close()
    print("Replayed: the page reached the recorded end state.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def compile_run(
    start_url: str,
    steps: list[dict],
    final: dict | None = None,
    *,
    task: str = "",
    viewport: tuple[int, int] = (1280, 800),
    filename: str = "replay.py",
) -> Compiled:
    """Python source replaying `steps` (each {"kind", "ok", "detail", "describe"}) from `start_url`."""
    compiler = _Compiler(start_url)
    last_url = start_url
    for n, step in enumerate(steps, start=1):
        if not step.get("ok", True) or not step.get("detail"):
            continue
        detail = step["detail"]
        url_before = detail.get("url", last_url)
        if url_before != last_url and compiler.ops:
            compiler.add(_Op([f"expect(page).to_have_url({compiler.url_expr(url_before)})"], comment=""))
        last_url = url_before
        compiler.step(n, step["kind"], detail, step.get("describe", step["kind"]))
    if final and final.get("url") and final["url"] != last_url and compiler.ops:
        last_url = final["url"]
    lines: list[str] = []
    for op in compiler.ops:
        if op.comment:
            lines.append(f"# {printable(op.comment)}")  # a key named "\n" must not end the comment
        lines.extend(op.code)
    checks = _assertions(compiler, final, last_url)
    if checks:
        lines.append("# the recorded end state")
        lines.extend(checks)
    if not any(line and not line.startswith("#") for line in lines):
        lines.append("pass")
    body = "\n".join(f"    {line}" for line in lines)
    doc_task = " ".join((task or "(not recorded)").split()).replace("\\", "\\\\").replace('"""', "'''")
    source = _TEMPLATE.format(
        title=doc_task[:80],
        task=doc_task,
        filename=filename,
        start_url=q(start_url),
        width=viewport[0],
        height=viewport[1],
        chromium_args=json.dumps(SCRIPT_CHROMIUM_ARGS),
        body=body,
    )
    source = secret_refs.read_from_environment(source)  # {{NAME}} -> os.environ["QVL_SECRET_NAME"]
    return Compiled(source, compiler.unexpressed)


def export_run(path: str | Path, start_url: str, steps: list[dict], final: dict | None, **kwargs) -> Compiled:
    """Compile and write the script to `path` (executable bit set); returns what was compiled."""
    path = Path(path)
    compiled = compile_run(start_url, steps, final, filename=path.name, **kwargs)
    path.write_text(compiled.source, encoding="utf-8")
    path.chmod(0o755)
    return compiled


BROWSER_FILE = "browser.json"  # beside trace.jsonl: {"url", "viewport", "final"}, written by `qvl-agent browse`


def write_browser_info(trace_dir: str | Path, url: str, viewport: tuple[int, int], final: dict | None = None) -> None:
    """Record what a browser run's trace does not: the start URL, the viewport and the final state."""
    info = {"url": url, "viewport": list(viewport), "final": final}
    path = Path(trace_dir) / BROWSER_FILE
    tmp = path.with_name(f".{BROWSER_FILE}.tmp")
    tmp.write_text(json.dumps(info, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(path)


def steps_from_trace(trace) -> list[dict]:
    """The executed actions of a run, in order, from a `trace.Trace`: each {"kind", "ok", "detail",
    "describe"}. Results line up with the step's actions; a step whose reply failed has none."""
    steps = []
    for record in trace.steps:
        actions = record.get("actions") or []
        for i, result in enumerate(record.get("results") or []):
            if i >= len(actions):
                break
            steps.append(
                {
                    "kind": actions[i].get("action", ""),
                    "ok": bool(result.get("ok")),
                    "detail": result.get("detail") or {},
                    "describe": result.get("action", ""),
                }
            )
    return steps


def export_trace(trace_dir: str | Path, path: str | Path) -> Compiled:
    """Compile the browser run recorded in `trace_dir` into the script `path`."""
    from qvl_agent.errors import InputError
    from qvl_agent.trace import read_trace

    trace = read_trace(trace_dir)
    info_path = Path(trace_dir) / BROWSER_FILE
    if not info_path.is_file():
        raise InputError(f"{trace_dir} is not a browser run: it has no {BROWSER_FILE}.")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{info_path} cannot be read ({exc}).") from None
    steps = steps_from_trace(trace)
    viewport = tuple(info.get("viewport") or (1280, 800))
    task = trace.run.get("task", "")
    return export_run(path, info["url"], steps, info.get("final"), task=task, viewport=viewport)
