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
  - answers each dialog the run answered (alert, confirm, prompt, beforeunload): the step that opened it
    is preceded by `DIALOGS.expect(type, message, accept[, text])` (the start page's are `START_DIALOGS`;
    a timer's is armed before the step before it) and followed by `DIALOGS.opened(type, message)`, which
    waits until it opened before the next step),
    and the one handler of every tab (`Dialogs.answer`) answers a dialog expected by then as recorded (the
    earliest with that type and message: a timer's dialog may come after a later step's); any other is
    dismissed and fails the replay with a sentence quoting its message, once the step returns (raising
    inside Playwright's event dispatch would leave the page blocked), as does a recorded one that never
    opened (waited for up to --timeout at the end),
  - replays only what had effect: a step whose navigation the run blocked (`--allow-domain`) is a comment,
  - waits the way Playwright recommends: auto-waiting locator actions, `expect(page).to_have_url` after a
    step that navigated, the close event of a tab that closes itself, never fixed sleeps; every wait and
    check in every tab holds for `--timeout` seconds (30 by default, so a slow machine is no failure),
  - ends with `expect` assertions on the final state that the steps produce (`assertions.py`): values of
    fields, text of editable elements, checked states, the URL (a query value that held a secret, masked
    as `{{NAME}}`, is matched as any value), and text that appeared after the last click; a step it
    cannot express is a loud `# !!! NOT REPLAYED` comment, and the checks that depend on it are left out.

The script is built, never edited: every value from the run reaches the code through `literals.lit`
(escaped, one line, `{{NAME}}` as a read of `os.environ["QVL_SECRET_NAME"]`), comments and the docstring
through `literals.comment_text` / `docstring_text` (placeholders stay text there), and `export_gate`
checks the finished source's syntax tree against the template before anything is written.

The script reads the browser executable from `--browser PATH` or `$QVL_BROWSER`, else Playwright's own.
This module is pure: no Playwright, no browser, no file system except `export_run`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.playwright.flags import CHROMIUM_ARGS
from qvl_agent.scripts.export.assertions import end_state_assertions
from qvl_agent.scripts.export.gate import check_export
from qvl_agent.scripts.export.steps import Op, StepCompiler, python_locator, q, target_key
from qvl_agent.scripts.export.template import TEMPLATE, reference_source
from qvl_agent.scripts.header import render_header, script_origins
from qvl_agent.scripts.intent import comment as intent_comment
from qvl_agent.scripts.intent import op_action, reason_of, step_intent
from qvl_agent.scripts.literals import comment_text, docstring_text, lit, read_secrets, typed_code
from qvl_agent.secrets import PLACEHOLDER
from qvl_agent.trace import write_private

__all__ = ["Compiled", "compile_run", "export_run", "export_trace", "python_locator", "write_browser_info"]

# Chromium flags the exported script passes (the same as the executor's): no network calls of its own.
SCRIPT_CHROMIUM_ARGS = list(CHROMIUM_ARGS)


@dataclass
class Compiled:
    source: str
    unexpressed: list[str] = field(default_factory=list)  # steps the script could not express faithfully


def _origin(url: str) -> str:
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", url)
    return m.group(0) if m else ""


def _url_expr(url: str, origin: str) -> str:
    """The URL check's argument: the recorded URL (on the start origin: relative to `origin`, so --url moves
    it along). A query value holding a masked secret (`{{NAME}}`) is left out: it is matched as any value,
    so the check neither holds the secret nor fails on it."""
    relative = bool(origin) and url.startswith(origin)
    rest = url[len(origin) :] if relative else url
    if not PLACEHOLDER.search(rest):
        return f"origin + {lit(rest)}" if relative else lit(rest)
    without_fragment = rest.split("#", 1)[0]
    head, _, query = without_fragment.partition("?")
    pattern = _loose(head)
    if query:
        fields = []
        for pair in query.split("&"):
            key, equals, value = pair.partition("=")
            fields.append(_loose(key + equals) + (r"[^&#]*" if PLACEHOLDER.search(value) else re.escape(value)))
        pattern += r"\?" + "&".join(fields)
    pattern += r"(#.*)?$"
    # The values are matched loosely (their encoding may differ); the path and names must be the run's.
    if relative:
        return f're.compile("^" + re.escape(origin) + {lit(pattern)})'
    return f"re.compile({lit('^' + pattern)})"


def _dialog_args(dialog: dict) -> list:
    """A recorded dialog and its answer: [type, message, accept] and the text a prompt got."""
    args = [str(dialog["type"]), str(dialog["message"]), bool(dialog["accept"])]
    if dialog.get("accept") and isinstance(dialog.get("text"), str):
        args.append(dialog["text"])
    return args


def _expect_dialog(dialog: dict) -> str:
    """`DIALOGS.expect(...)` for a recorded dialog and its answer; every value through `lit`, and a prompt's
    text recorded as segments (`Secrets.segments`) through `typed_code`, so a secret is read where the model
    typed its placeholder."""
    args = [lit(arg) for arg in _dialog_args(dialog)]
    if len(args) == 4 and isinstance(dialog.get("typed"), list):
        args[3] = typed_code(dialog["typed"])
    return f"DIALOGS.expect({', '.join(args)})"


def _dialog_opened(dialog: dict) -> str:
    """`DIALOGS.opened(type, message)`: the replay waits for a page's own dialog the run met here."""
    return f"DIALOGS.opened({lit(str(dialog['type']))}, {lit(str(dialog['message']))})"


def _loose(text: str) -> str:
    """A pattern for `text` where each placeholder matches whatever the page put there."""
    return r"[^/?#&]*".join(re.escape(part) for part in PLACEHOLDER.split(text)[::2])


def _identity_check(intent: dict) -> list[str]:
    """Before a step whose element was found by its place alone: a check that the element there still reads
    what the recorded one read, so that another element moved into its place fails the step instead of
    being acted on. (Every other locator names its element, or the item holding it, itself.)"""
    if not intent.get("by_position") or not intent.get("name") or PLACEHOLDER.search(intent["name"]):
        return []  # nothing to read, or a masked secret's placeholder rather than the text the page showed
    code = python_locator(intent["locator"])
    return [f"expect({code}).to_have_text({q(intent['name'])}, use_inner_text=True)"] if code else []


def compile_run(
    start_url: str,
    steps: list[dict],
    final: dict | None = None,
    *,
    task: str = "",
    viewport: tuple[int, int] = (1280, 800),
    filename: str = "replay.py",
    start_dialogs: list[dict] = (),
) -> Compiled:
    """Python source replaying `steps` (each {"kind", "ok", "detail", "describe"}, and "step", the run's step
    number, for the comments) from `start_url`; `start_dialogs` are those the start page opened while it
    loaded (dismissed, before the first step). Raises InputError (one sentence) for a run it will not write,
    before anything is written."""
    origin = _origin(start_url)

    def url_expr(url: str) -> str:
        return _url_expr(url, origin)

    compiler = StepCompiler()
    intents: dict[str, dict] = {}  # target_key(locator) -> the latest step's intent on that element
    last_url = start_url
    last_step_at = 0  # where the ops of the latest step begin
    for i, step in enumerate(steps, start=1):
        n = step.get("step", i)  # the run's own step number, as the trace and the report show it
        if not step.get("ok", True) or not step.get("detail"):
            continue
        detail = step["detail"]
        if step["kind"] == "handle_dialog":  # one no action of the run opened (the page's timer)
            if "during" not in detail.get("dialog", {}):
                # Armed before the action that came before it: that action may have started the timer, and
                # a fast replay meets its dialog while the action is still returning.
                op = Op([_expect_dialog(detail["dialog"])], comment=f"step {n}: a dialog of the page")
                compiler.ops.insert(last_step_at, op)
                if last_step_at <= compiler.tab_start:  # the current tab's ops begin one later now
                    compiler.tab_start += 1
                # And met before the next step: a click the replay sent while it is still open would be lost.
                compiler.add(Op([_dialog_opened(detail["dialog"])]))
            continue
        last_step_at = len(compiler.ops)
        if detail.get("dialogs"):  # answered while this step's action ran: expected before it
            compiler.add(Op([_expect_dialog(d) for d in detail["dialogs"]]))
        if detail.get("blocked"):  # the run refused where it led (--allow-domain): it had no effect there
            hosts = ", ".join(str(host) for host in detail["blocked"])
            why = f"not replayed: the run blocked its navigation to {hosts}"
            compiler.add(Op([], comment=f"step {n}: {step.get('describe', step['kind'])} ({why})"))
            continue
        if detail.get("locator") and detail["locator"].get("kind") != "point":
            intents[target_key(detail["locator"])] = step_intent(n, step["kind"], detail, step.get("reason", ""))
        compiler.switch_tab(detail.get("tab", 0), f"step {n}: {step.get('describe', step['kind'])}")
        url_before = detail.get("url", last_url)
        if url_before != last_url and compiler.ops:
            compiler.add(Op([f"expect(page).to_have_url({url_expr(url_before)})"]))
        last_url = url_before
        compiler.step(n, step["kind"], detail, step.get("describe", step["kind"]), typed=step.get("typed"))
        for dialog in detail.get("dialogs") or []:  # met during the action (a timer's, too): before the next
            compiler.add(Op([_dialog_opened(dialog)]))
    if final is not None:  # the page the end state was read on (no "tab": the first)
        compiler.switch_tab(final.get("tab", 0), "the end state")
    final_fields = {target_key(item["locator"]): item["state"] for item in (final or {}).get("fields", [])}
    compiler.settle_selects(final_fields)
    lines: list[str] = ["tabs = [page]"] if compiler.uses_tabs else []
    for op in compiler.ops:
        if op.comment:
            lines.append(f"# {comment_text(op.comment)}")  # a key named "\n" must not end the comment
        if op.code and op.target in intents:
            intent = intents[op.target]
            lines.append(intent_comment(dict(intent, action=op_action(op.kind))))
            lines.extend(_identity_check(intent))
        lines.extend(op.code)
    checks = end_state_assertions(final, last_url, url_expr, compiler.lost, compiler.filled)
    if checks:
        lines.append("# the recorded end state")
        lines.extend(checks)
    if not any(line and not line.startswith("#") for line in lines):
        lines.append("pass")
    body = "\n".join(f"    {line}" for line in lines)
    # The docstring keeps placeholders as text: it is read before `import os`, and it is for the person.
    task = " ".join(str(task or "(not recorded)").split())
    source = TEMPLATE.format(
        header=render_header(filename, script_origins(start_url)),
        title=docstring_text(task[:80]),
        task=docstring_text(task),
        filename=docstring_text(filename),
        start_url=lit(start_url),
        width=lit(int(viewport[0])),
        height=lit(int(viewport[1])),
        chromium_args=lit(SCRIPT_CHROMIUM_ARGS),
        secrets=lit(read_secrets("if True:\n" + body)),  # the variables the steps read, from their syntax
        start_dialogs=lit([_dialog_args(d) for d in start_dialogs]),
        body=body,
    )
    check_export(source, reference_source())  # run data can never have become code
    return Compiled(source, [comment_text(note) for note in compiler.unexpressed])


def export_run(
    path: str | Path, start_url: str, steps: list[dict], final: dict | None, *, replace: bool = True, **kwargs
) -> Compiled:
    """Compile and write the script to `path`, private to the person (0600: it records where they went and
    what they typed); returns what was compiled. Nothing is written when compiling fails. With
    `replace=False` (the person's own --export path) an existing file, or a link, there is never touched."""
    path = Path(path)
    compiled = compile_run(start_url, steps, final, filename=path.name, **kwargs)
    if replace:
        write_private(path, compiled.source)
    else:
        _write_new(path, compiled.source)
    return compiled


def _write_new(path: Path, text: str) -> None:
    from qvl_agent.errors import InputError

    try:  # O_EXCL: refuses whatever is there, a dangling link included; created 0600 from the start
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        raise InputError(
            f"{path} already exists: the script was not written (remove it or choose another name)."
        ) from None
    except OSError as exc:
        raise InputError(f"Cannot write the script to {path}: {exc.strerror}.") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


TypedRecord = dict[tuple[int, int], list]  # (step, action index) -> `Secrets.segments` of what it typed

BROWSER_FILE = "browser.json"  # beside trace.jsonl: {"url", "viewport", "final"}, written by `qvl-agent browse`


def write_browser_info(trace_dir: str | Path, url: str, viewport: tuple[int, int], final: dict | None = None) -> None:
    """Record what a browser run's trace does not: the start URL, the viewport and the final state."""
    info = {"url": url, "viewport": list(viewport), "final": final}
    write_private(Path(trace_dir) / BROWSER_FILE, json.dumps(info, ensure_ascii=False, indent=1))


def steps_from_trace(trace, typed: TypedRecord | None = None) -> list[dict]:
    """The executed actions of a run, in order, from a `trace.Trace`: each {"step", "kind", "ok", "detail",
    "describe"}, and "typed" where `typed` (the run's own record, `agent.Agent.typed`) holds what a `type`
    action typed. Results line up with the step's actions; a step whose reply failed has none."""
    typed = typed or {}
    steps = []
    for record in trace.steps:
        actions = record.get("actions") or []
        for i, result in enumerate(record.get("results") or []):
            if i >= len(actions):
                break
            steps.append(
                {
                    "step": record["step"],
                    "kind": actions[i].get("action", ""),
                    "ok": bool(result.get("ok")),
                    "detail": result.get("detail") or {},
                    "describe": result.get("action", ""),
                    "reason": reason_of(record.get("reply", "")),
                    **({"typed": typed[record["step"], i]} if (record["step"], i) in typed else {}),
                }
            )
    return steps


def export_trace(
    trace_dir: str | Path, path: str | Path, *, replace: bool = True, typed: TypedRecord | None = None
) -> Compiled:
    """Compile the browser run recorded in `trace_dir` into the script `path` (see `export_run`).

    `typed` is the run's own record of what each `type` action typed (`agent.Agent.typed`), kept in memory
    because the trace masks every secret's value wherever it shows: with it, a secret is read where the
    model typed its placeholder and only there, and the rest is typed as the model wrote it (a user name
    that happens to equal the password stays a user name). Without it, typed text is what the trace shows."""
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
    steps = steps_from_trace(trace, typed)
    viewport = tuple(info.get("viewport") or (1280, 800))
    task = trace.run.get("task", "")
    start_dialogs = trace.steps[0].get("dialogs_before", []) if trace.steps else []
    return export_run(
        path, info["url"], steps, info.get("final"), task=task, viewport=viewport, replace=replace,
        start_dialogs=start_dialogs,
    )  # fmt: skip
