"""Compiling a finished browser run into a standalone Playwright script that replays it without the model.

Input: the run's steps as the trace holds them (each step's action and the `detail` the browser executor
recorded: the locator of the element acted on, its state before and after, the page URL) and, when the
run left one, the final state the executor checked in the live page (`final.json`). Output: Python source
using Playwright's sync API, importing nothing from qvl_agent, that

  - opens the start URL (`--url` overrides it; recorded URLs on the same origin follow the override),
  - acts through locators (`steps.py`): a click then typing into a field becomes `fill` (a date input's
    value in its ISO form), a checkbox click `check` / `uncheck`, a select's choice `select_option` with
    every selected option, other clicks `click`, at the run's own point inside the element where a centre
    click would act elsewhere; keys the page listens to stay key presses; only a click whose element had
    no unique locator falls back to the recorded CSS pixel,
  - follows the run into a tab it opened (`expect_popup`) and back to an earlier one,
  - waits the way Playwright recommends: auto-waiting locator actions and `expect(page).to_have_url`
    after a step that navigated, never fixed sleeps,
  - ends with `expect` assertions on the final state that the steps produce (`assertions.py`): values of
    fields, text of editable elements, checked states, the URL, and text that appeared after the last
    click; a step it cannot express is a loud `# !!! NOT REPLAYED` comment, and the checks that depend
    on it are left out.

The script reads the browser executable from `--browser PATH` or `$QVL_BROWSER`, else Playwright's own.
This module is pure: no Playwright, no browser, no file system except `export_run`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.playwright import secret_refs
from qvl_agent.playwright.assertions import end_state_assertions
from qvl_agent.playwright.flags import CHROMIUM_ARGS
from qvl_agent.playwright.header import render_header, script_origins
from qvl_agent.playwright.intent import comment as intent_comment
from qvl_agent.playwright.intent import op_action, reason_of, step_intent
from qvl_agent.playwright.steps import Op, StepCompiler, comment_text, python_locator, q, target_key
from qvl_agent.trace import write_private

__all__ = ["Compiled", "compile_run", "export_run", "export_trace", "python_locator", "write_browser_info"]

# Chromium flags the exported script passes (the same as the executor's): no network calls of its own.
SCRIPT_CHROMIUM_ARGS = list(CHROMIUM_ARGS)


@dataclass
class Compiled:
    source: str
    unexpressed: list[str] = field(default_factory=list)  # steps the script could not express faithfully


def _docstring_text(text: str) -> str:
    """`text` on one line inside the script's docstring: no line breaks, no closing quotes, no escapes."""
    return comment_text(" ".join(text.split())).replace("\\", "\\\\").replace('"""', "'''")


def _origin(url: str) -> str:
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", url)
    return m.group(0) if m else ""


_TEMPLATE = '''#!/usr/bin/env python3
{header}"""Replays a browser run recorded by qvl-agent, without the model: {title}

Task: {task}
Run:  python {filename} [--browser PATH] [--url URL] [--headed] [--timeout SECONDS]
      (the browser comes from --browser, else $QVL_BROWSER, else Playwright's own Chromium)
Exit status 0 when the page reaches the recorded end state, 1 when it does not.
Each step's `# intent:` line says what it meant, for `qvl-agent replay --heal`; python ignores it.
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
    origin = _origin(start_url)

    def url_expr(url: str) -> str:
        return f"origin + {q(url[len(origin) :])}" if origin and url.startswith(origin) else q(url)

    compiler = StepCompiler()
    intents: dict[str, dict] = {}  # target_key(locator) -> the latest step's intent on that element
    last_url = start_url
    for n, step in enumerate(steps, start=1):
        if not step.get("ok", True) or not step.get("detail"):
            continue
        detail = step["detail"]
        if detail.get("locator") and detail["locator"].get("kind") != "point":
            intents[target_key(detail["locator"])] = step_intent(n, step["kind"], detail, step.get("reason", ""))
        compiler.switch_tab(detail.get("tab", 0), f"step {n}: {step.get('describe', step['kind'])}")
        url_before = detail.get("url", last_url)
        if url_before != last_url and compiler.ops:
            compiler.add(Op([f"expect(page).to_have_url({url_expr(url_before)})"]))
        last_url = url_before
        compiler.step(n, step["kind"], detail, step.get("describe", step["kind"]))
    if final is not None:  # the page the end state was read on (no "tab": the first)
        compiler.switch_tab(final.get("tab", 0), "the end state")
    final_fields = {target_key(item["locator"]): item["state"] for item in (final or {}).get("fields", [])}
    compiler.settle_selects(final_fields)
    lines: list[str] = ["tabs = [page]"] if compiler.uses_tabs else []
    for op in compiler.ops:
        if op.comment:
            lines.append(f"# {comment_text(op.comment)}")  # a key named "\n" must not end the comment
        if op.code and op.target in intents:
            lines.append(intent_comment(dict(intents[op.target], action=op_action(op.kind))))
        lines.extend(op.code)
    checks = end_state_assertions(final, last_url, url_expr, compiler.lost)
    if checks:
        lines.append("# the recorded end state")
        lines.extend(checks)
    if not any(line and not line.startswith("#") for line in lines):
        lines.append("pass")
    body = "\n".join(f"    {line}" for line in lines)
    doc_task = _docstring_text(task or "(not recorded)")
    source = _TEMPLATE.format(
        header=render_header(filename, script_origins(start_url)),
        title=doc_task[:80],
        task=doc_task,
        filename=_docstring_text(filename),
        start_url=q(start_url),
        width=viewport[0],
        height=viewport[1],
        chromium_args=json.dumps(SCRIPT_CHROMIUM_ARGS),
        body=body,
    )
    source = secret_refs.read_from_environment(source)  # {{NAME}} -> os.environ["QVL_SECRET_NAME"]
    return Compiled(source, [comment_text(note) for note in compiler.unexpressed])


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
    write_private(Path(trace_dir) / BROWSER_FILE, json.dumps(info, ensure_ascii=False, indent=1))


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
                    "reason": reason_of(record.get("reply", "")),
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
