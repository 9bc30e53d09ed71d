"""A page's dialog without a browser: the agent's turn for it (a recording executor that opens a dialog
while a click is in flight, as Playwright's handler would), and the export gate on recorded dialogs."""

from __future__ import annotations

import json

import pytest

from qvl_agent import actions as A
from qvl_agent.act.base import ActionResult, Dialog
from qvl_agent.act.guard import Guard
from qvl_agent.agent import Agent
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from qvl_agent.parse import parse_actions
from qvl_agent.scripts.export.exporter import compile_run, steps_from_trace
from qvl_agent.scripts.export.gate import UnsafeScript, check_export
from qvl_agent.scripts.export.template import reference_source
from qvl_agent.secrets import Secrets
from qvl_agent.trace import TraceWriter, read_trace
from tests.support.recording import RecordingExecutor

URL = "http://127.0.0.1:8000/note.html"
DELETE = {"kind": "role", "role": "button", "name": "Delete"}


def call(**args) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"


def screen(n: int) -> Screenshot:
    return Screenshot(bytes([n, 0, 0, 0]) * (200 * 100), 200, 100, "BGRA")


class DialogExecutor(RecordingExecutor):
    """Each click opens a confirm and asks the agent's callback, as the browser's dialog handler does."""

    def __init__(self):
        super().__init__([screen(i) for i in range(1, 30)])
        self.answer = None
        self.answers: list[A.HandleDialog] = []

    def answer_dialogs_with(self, answer):
        self.answer = answer
        return []

    def execute(self, action, shot):
        result = super().execute(action, shot)
        if isinstance(action, A.LeftClick) and self.answer is not None:
            self.answers.append(self.answer(Dialog("confirm", "Sure?", during=A.describe(action))))
        return ActionResult(True, result.message, result.detail)


def run(replies, tmp_path, **kw):
    executor = DialogExecutor()
    guard = Guard(mode="auto")
    agent = Agent(ReplayEngine(replies), executor, guard, TraceWriter(tmp_path), prompt_name="browser", **kw)
    return agent, executor, agent.run("Delete it")


def test_the_dialog_is_one_model_turn_and_a_step_of_its_own(tmp_path):
    replies = [call(action="left_click", coordinate=[500, 500]), call(action="handle_dialog", accept=True),
               call(action="terminate", status="success")]  # fmt: skip
    agent, executor, result = run(replies, tmp_path)
    assert result.status == "success" and executor.answers == [A.HandleDialog(True)]
    steps = read_trace(tmp_path).steps
    assert [s["step"] for s in steps] == [1, 2, 3]  # the dialog's turn is written after the step it interrupted
    assert steps[1]["dialog"]["message"] == "Sure?" and '"Sure?"' in steps[1]["observation"]
    assert steps[1]["results"][0]["detail"]["dialog"]["during"] == "left_click at (500, 500)"
    assert agent.engine.requests[1].image_hashes == agent.engine.requests[0].image_hashes  # the latest screenshot


def test_no_answer_the_stop_switch_and_the_step_limit_dismiss_the_dialog(tmp_path):
    _, executor, result = run([call(action="left_click", coordinate=[5, 5]), "OK then", call(action="terminate",
                              status="success")], tmp_path / "a")  # fmt: skip
    assert executor.answers == [A.HandleDialog(False)] and result.status == "success"
    assert "could not be read" in read_trace(tmp_path / "a").steps[1]["error"]

    _, executor, result = run([call(action="left_click", coordinate=[5, 5])], tmp_path / "b", max_steps=1)
    assert executor.answers == [A.HandleDialog(False)] and result.status == "limit"
    assert "step limit" in read_trace(tmp_path / "b").steps[0]["dialogs"][0]["why"]

    class Stopping(DialogExecutor):
        def execute(self, action, shot):
            guard.stop("The emergency stop was pressed.")
            return super().execute(action, shot)

    executor, guard = Stopping(), Guard(mode="auto")
    agent = Agent(ReplayEngine([call(action="left_click", coordinate=[5, 5])]), executor, guard, prompt_name="browser")
    assert agent.run("Delete it").status == "stopped" and executor.answers == [A.HandleDialog(False)]


def test_handle_dialog_parses_and_is_refused_when_no_dialog_is_open(tmp_path):
    assert parse_actions(call(action="handle_dialog", accept="false")) == [A.HandleDialog(False)]
    assert parse_actions(call(action="handle_dialog", accept=True, promptText="x")) == [A.HandleDialog(True, "x")]
    with pytest.raises(Exception, match='"accept": true'):
        parse_actions(call(action="handle_dialog"))
    _, executor, result = run([call(action="handle_dialog", accept=True), call(action="terminate",
                              status="success")], tmp_path)  # fmt: skip
    assert result.status == "success" and "No dialog is open" in read_trace(tmp_path).steps[0]["error"]


HOSTILE = [
    '"); import os; os.system("id") #',
    "line one\nline two\r\n\u2028\u2029\x85 end",
    "''' \"\"\" \\ \\x41 \\N{BULLET} {x} {{PASSWORD}}",
    "\x00\x1b[31m red",
]


@pytest.mark.parametrize("message", HOSTILE)
def test_a_hostile_dialog_message_exports_as_a_literal_and_the_gate_passes_it(message):
    dialog = {"type": "confirm", "message": message, "accept": True, "text": message}
    steps = [
        {"kind": "left_click", "ok": True, "describe": "left_click", "detail": {"url": URL, "locator": DELETE,
         "before": {}, "after": {}, "dialogs": [dialog]}},
        {"kind": "handle_dialog", "ok": True, "describe": "x", "detail": {"dialog": dict(dialog, type="alert")}},
    ]  # fmt: skip
    source = compile_run(URL, steps, None, start_dialogs=[dict(dialog, type="prompt")]).source
    namespace: dict = {}
    exec(compile(source.replace('if __name__ == "__main__":', "if False:"), "out.py", "exec"), namespace)
    expected = [d[:2] for d in namespace["DIALOGS"].expected]
    assert expected == [("prompt", message)]  # the start page's; the others are armed inside replay()
    calls = [line.strip() for line in source.splitlines() if line.strip().startswith("DIALOGS.expect(")]
    assert len(calls) == 2
    for line in calls:
        args = eval(line[len("DIALOGS.expect") :], {"os": __import__("os")})  # literals only, no names
        assert args[1] == message
    # Each is waited for where the run met it, before the next step, by its literals alone.
    waits = [line.strip() for line in source.splitlines() if line.strip().startswith("DIALOGS.opened(")]
    assert [eval(line[len("DIALOGS.opened") :], {}) for line in waits] == [("confirm", message), ("alert", message)]


@pytest.mark.parametrize(
    "line",
    [
        'DIALOGS.expect("alert", __import__("os").system("id"), True)',
        'DIALOGS.expect("alert", "x", True, text="y")',
        'DIALOGS.answer("alert")',
        "DIALOGS.expected.clear()",
        'DIALOGS.expect("alert", "x", True, "y", "z")',
        'DIALOGS.opened("alert", __import__("os").system("id"))',
        'DIALOGS.opened("alert")',
        'DIALOGS.opened("alert", "x", page)',
        'DIALOGS.opened(kind="alert", message="x")',
        'print("alert")',
        'dialogs.expect("alert", "x", True)',
    ],
)
def test_the_gate_still_refuses_anything_else(line):
    head = "def replay(page, origin):\n"
    source = compile_run(URL, [], None).source.replace(head, f"{head}    {line}\n", 1)
    assert line in source
    with pytest.raises(UnsafeScript):
        check_export(source, reference_source())


def test_a_secret_typed_into_a_prompt_reaches_the_page_and_never_the_trace(tmp_path):
    class Echoing(DialogExecutor):  # the page's message repeats the secret's value
        def execute(self, action, shot):
            result = RecordingExecutor.execute(self, action, shot)
            if isinstance(action, A.LeftClick):  # recorded as the browser executor records it
                choice = self.answer(Dialog("prompt", "PIN for 4711-secret?", during="click"))
                self.answers.append(choice)
                opened = {"type": "prompt", "message": "PIN for 4711-secret?", "accept": True, "text": choice.text}
                return ActionResult(True, result.message, dict(result.detail, dialogs=[opened]))
            return result

    executor = Echoing()
    replies = [call(action="left_click", coordinate=[5, 5]),
               call(action="handle_dialog", accept=True, text="{{PIN}}"),
               call(action="terminate", status="success")]  # fmt: skip
    agent = Agent(ReplayEngine(replies), executor, Guard(mode="auto"), TraceWriter(tmp_path), prompt_name="browser",
                  secrets=Secrets({"PIN": "4711-secret"}))  # fmt: skip
    assert agent.run("Enter the PIN {{PIN}}").status == "success"
    assert executor.answers == [A.HandleDialog(True, "4711-secret")]  # the page gets the value
    text = (tmp_path / "trace.jsonl").read_text()
    assert "4711-secret" not in text and "{{PIN}}" in text
    assert "4711-secret" not in agent.engine.requests[1].text  # nor does the model see it in the message
    steps = read_trace(tmp_path).steps
    assert steps[0]["results"][0]["detail"]["dialogs"][0]["typed"] == [["secret", "PIN"]]
    source = compile_run(URL, steps_from_trace(read_trace(tmp_path)), None).source
    assert 'DIALOGS.expect("prompt", "PIN for {{PIN}}?", True, os.environ["QVL_SECRET_PIN"])' in source
    assert 'SECRETS = ["QVL_SECRET_PIN"]' in source  # asked for before the browser starts
