"""The text of every exported script around its steps: the header, the docstring, the constants, the
`Dialogs` class, `replay(page, origin)` (where the steps go), `main()` with its failures in words, and the
helpers that name a failing step. `exporter.compile_run` fills it; `gate.check_export` compares a script
against `reference_source()`, the template with neutral values, so nothing outside `replay()` and the
constants' literals can differ from what is written here. Pure text: nothing here runs in qvl-agent.
"""

TEMPLATE = '''#!/usr/bin/env python3
{header}"""Replays a browser run recorded by qvl-agent, without the model: {title}

Task: {task}
Run:  qvl-agent replay {filename} [--url URL]   (in the sandbox; see the lines above)
Or:   python {filename} [--browser PATH] [--url URL] [--headed] [--timeout SECONDS]
      (your own choice: then it has all of your rights; the browser comes from --browser, else
      $QVL_BROWSER, else Playwright's own Chromium; each step and check waits up to
      --timeout seconds, default 30)
Exit status 0 when the page reaches the recorded end state, 1 when it does not (the failing step is
named, in words), 2 when a secret it types is not set.
Each step's `# intent:` line says what it meant, for `qvl-agent replay --heal`; python ignores it.
"""

import argparse
import json
import os
import re
import sys
import traceback

from playwright.sync_api import Error, expect, sync_playwright

START_URL = {start_url}
VIEWPORT = {{"width": {width}, "height": {height}}}
CHROMIUM_ARGS = {chromium_args}
SECRETS = {secrets}  # the environment variables the steps type secrets from
START_DIALOGS = {start_dialogs}


class Dialogs:
    """Answers every dialog of the run's tabs: one expected by now, with the recorded type and message, as
    the run answered it; any other is dismissed and fails the replay (`check`)."""

    def __init__(self, expected):
        self.expected = []
        self.unexpected = []
        self.where = ""  # the step of replay() that met the first unexpected dialog (in words), or "the end"
        self.page, self.seconds = None, 0  # the first tab and --timeout, once main() has them
        for dialog in expected:
            self.expect(*dialog)

    def expect(self, kind, message, accept, text=None):
        self.expected.append((kind, message, accept, text))

    def opened(self, kind, message):
        """Wait until a recorded dialog of the page's own (a timer's), which the run met before its next step,
        has opened and been answered: a click sent while it is open is lost. Up to --timeout; one that never
        opens fails the replay at the end."""
        for _ in range(int(self.seconds * 10)):
            if self.unexpected or not any(expected[:2] == (kind, message) for expected in self.expected):
                return
            try:
                self.page.wait_for_timeout(100)
            except Error:
                return  # the first tab is gone: the next step meets what it meets

    def answer(self, dialog):
        match = [i for i, expected in enumerate(self.expected) if expected[:2] == (dialog.type, dialog.message)]
        if match:  # the earliest of its kind: a page's timer may open its dialog after a later step's
            accept, text = self.expected.pop(match[0])[2:]
            if not accept:
                dialog.dismiss()
            elif text is None:
                dialog.accept()
            else:
                dialog.accept(text)
        else:
            self.unexpected.append("the page opened an unexpected " + dialog.type + " dialog " + repr(dialog.message)
                                   + " (it was dismissed)")
            line = replay_line()
            self.where = self.where or (step_at(line) if line else "the start")
            dialog.dismiss()

    def check(self, page, seconds):
        for _ in range(int(seconds * 10)):  # a page's timer may open a recorded dialog late
            if not self.expected or self.unexpected:
                break
            page.wait_for_timeout(100)
        if self.unexpected:
            raise AssertionError(self.unexpected[0])
        if self.expected:
            self.where = "the end"
            raise AssertionError("the recorded " + self.expected[0][0] + " dialog " + repr(self.expected[0][1])
                                 + " did not open")


DIALOGS = Dialogs(START_DIALOGS)  # the start page's, while it loads


def replay(page, origin):
{body}


def main():
    parser = argparse.ArgumentParser(description="Replay a recorded browser run.")
    parser.add_argument("--browser", default=os.environ.get("QVL_BROWSER"), help="Chromium executable")
    parser.add_argument("--url", default=START_URL, help="start URL (default: the recorded one)")
    parser.add_argument("--headed", action="store_true", help="show the browser window")
    parser.add_argument("--timeout", type=float, default=30, help="seconds each step may wait (default 30)")
    args = parser.parse_args()
    missing = [name for name in SECRETS if name not in os.environ]
    if missing:
        print(f"This script types a secret from ${{missing[0]}}, which is not set: set it first "
              f"(export {{missing[0]}}=...).", file=sys.stderr)
        return 2
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
            DIALOGS.page, DIALOGS.seconds = page, args.timeout
            page.context.set_default_timeout(args.timeout * 1000)  # every tab the run opens waits as long
            expect.set_options(timeout=args.timeout * 1000)
            page.context.on("dialog", DIALOGS.answer)  # every tab's dialogs
            page.goto(args.url)
            replay(page, origin)
            DIALOGS.check(page, args.timeout)
        except (AssertionError, Error) as exc:
            message = str(exc).strip().splitlines() or [type(exc).__name__]
            if DIALOGS.unexpected:  # what made the step fail, or the page take another way
                message = [DIALOGS.unexpected[0]]
            where = DIALOGS.where or failed_step(exc)
            print(f"Replay failed at {{where}}: {{message[0]}}", file=sys.stderr)
            for line in message[1:8]:  # Playwright's call log: what it waited for, and what it found
                print("  " + line, file=sys.stderr)
            keep_failure(os.environ.get("QVL_REPLAY_FAILURE_DIR"), browser, where, exc)
            return 1
        finally:
            browser.close()
    print("Replayed: the page reached the recorded end state.")
    return 0


def failed_step(exc):
    """Which step `exc` ended, in words: the step of the line of replay() that raised it."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.name == "replay" and os.path.abspath(frame.filename) == os.path.abspath(__file__):
            return step_at(frame.lineno)
    return "the start"


def replay_line():
    """The line replay() is at now, seen from a dialog handler: Playwright calls it on a greenlet of its own,
    while replay() waits on the greenlet it came from."""
    import greenlet

    here = greenlet.getcurrent()
    frames = [sys._getframe()]
    g = here.parent
    while g is not None:
        frames.append(g.gr_frame)
        g = g.parent
    for frame in frames:
        for found in reversed(traceback.extract_stack(frame)):
            if found.name == "replay" and os.path.abspath(found.filename) == os.path.abspath(__file__):
                return found.lineno
    return None


def step_at(lineno):
    """The step that line `lineno` of replay() belongs to, in words, from the `# intent:` line above it."""
    lines = open(__file__, encoding="utf-8").read().splitlines()
    for line in reversed(lines[: lineno - 1]):
        text = line.strip()
        if text == "# the recorded end state":
            return f"the recorded end state (line {{lineno}})"
        if text.startswith("# intent: "):
            try:
                intent = dict(json.loads(text[len("# intent: ") :]))
            except (ValueError, TypeError):
                intent = {{}}
            what = [intent.get("action", "act on"), "the"]
            what += [json.dumps(intent["name"], ensure_ascii=False)] if intent.get("name") else []
            what += [intent.get("role") or "element"]
            if intent.get("item"):
                what += ["in the item that says", json.dumps(intent["item"], ensure_ascii=False)]
            return f"step {{intent.get('step', '?')}} ({{' '.join(what)}}, line {{lineno}})"
    return f"line {{lineno}}"


def keep_failure(folder, browser, where, exc):
    """The whole message and a screenshot of each tab, in `folder` (qvl-agent replay's run folder)."""
    if not folder:
        return
    with open(os.path.join(folder, "failure.log"), "w", encoding="utf-8") as log:
        log.write(f"Replay failed at {{where}}:\\n{{exc}}\\n")
    for n, tab in enumerate(page for context in browser.contexts for page in context.pages):
        try:
            tab.screenshot(path=os.path.join(folder, f"failure-{{n + 1}}.png"), timeout=5000)
        except Error:
            pass  # a tab that closed or hangs has no picture to give


if __name__ == "__main__":
    sys.exit(main())
'''


def reference_source() -> str:
    """The template with neutral values: what `export_gate` compares the script against."""
    return TEMPLATE.format(
        header="",
        title="",
        task="",
        filename="replay.py",
        start_url='""',
        width=1,
        height=1,
        chromium_args="[]",
        secrets="[]",
        start_dialogs="[]",
        body="    pass",
    )
