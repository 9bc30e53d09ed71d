"""Hostile model output against the guard and the parser: system key combinations, floods of actions,
endless text, absurd JSON, control characters meant for the person's terminal (no display needed)."""

from __future__ import annotations

import ast
import json

import pytest

from qvl_agent import actions as A
from qvl_agent.act.dry_run import DryRunExecutor
from qvl_agent.act.guard import Guard, terminal_confirm
from qvl_agent.act.keys import system_chord
from qvl_agent.agent import Agent
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from qvl_agent.scripts.export.exporter import compile_run
from qvl_agent.scripts.write.policy import check_script
from qvl_agent.trace import TraceWriter, read_trace
from tests.support.recording import RecordingExecutor

STOP = "<ctrl>+<alt>+<esc>"


def screen(n: int = 1) -> Screenshot:
    return Screenshot(bytes([n, 0, 0, 0]) * (200 * 100), 200, 100, "BGRA")


def call(**args) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"


def run(replies, mode="auto", executor=None, trace=None, **guard_kw):
    engine = ReplayEngine([*replies, call(action="terminate", status="success")])
    executor = executor or RecordingExecutor([screen(i) for i in range(1, 30)])
    guard = Guard(mode=mode, hotkey=STOP, **guard_kw)
    result = Agent(engine, executor, guard, trace=trace, max_retries=5).run("Do it")
    return result, engine, executor


@pytest.mark.parametrize(
    "keys",
    [
        ["ctrl", "alt", "delete"],
        ["Control", "Alt", "Del"],
        ["ctrl", "alt", "backspace"],
        ["ctrl", "alt", "F1"],
        ["ctrl", "alt", "f12"],
        ["super"],
        ["Meta"],
        ["win", "l"],
        ["cmd", "shift", "q"],
        ["ctrl", "alt", "l"],
        ["ctrl", "alt", "esc"],  # the emergency stop chord itself
        # pyautogui's one-sided modifier names, and its Sleep key
        ["ctrlleft", "altleft", "f1"],
        ["ctrlright", "altright", "delete"],
        ["ctrlleft", "optionright", "backspace"],
        ["winleft"],
        ["winright", "l"],
        ["winleft", "shiftleft", "q"],
        ["ctrlleft", "altright", "esc"],
        ["sleep"],
    ],
)
def test_system_key_combinations_are_asked_about_even_in_auto_mode_and_a_no_goes_to_the_model(keys):
    asked = []
    result, engine, ex = run([call(action="key", keys=keys)], confirm=lambda a, p, s: asked.append(a) or False)
    assert result.status == "success"  # the run goes on: the refusal is an observation
    assert asked == [A.Key(tuple(k if len(k) == 1 else k.lower() for k in keys))]
    assert ex.actions == []  # nothing was pressed
    assert "was refused" in engine.requests[1].text and "system key" in engine.requests[1].text


def test_a_yes_presses_it_and_allow_keys_presses_it_without_asking():
    _, _, ex = run([call(action="key", keys=["super"])], confirm=lambda a, p, s: True)
    assert ex.actions == [A.Key(("super",))]
    asked = []
    _, _, ex = run([call(action="key", keys=["ctrl", "alt", "delete"])], allow_keys=True,
                   confirm=lambda a, p, s: asked.append(a) or False)  # fmt: skip
    assert ex.actions == [A.Key(("ctrl", "alt", "delete"))] and asked == []


def test_ordinary_chords_run_in_auto_mode_without_a_question():
    asked = []
    keys = [
        ["ctrl", "c"],
        ["alt", "tab"],
        ["ctrl", "alt", "t"],
        ["shift", "f10"],
        ["enter"],
        ["ctrl", "l"],
        ["ctrlleft", "c"],
        ["shiftright", "tab"],
    ]
    _, _, ex = run([call(action="key", keys=k) for k in keys], confirm=lambda a, p, s: asked.append(a) or False)
    assert asked == [] and len(ex.actions) == len(keys)
    assert all(system_chord(tuple(k)) == "" for k in keys)


def test_too_many_actions_in_one_reply_run_none_of_them():
    flood = "".join(call(action="left_click", coordinate=[10, 10]) for _ in range(1000))
    result, engine, ex = run([flood, call(action="left_click", coordinate=[20, 20])], max_actions_per_reply=20)
    assert result.status == "success"
    assert ex.actions == [A.LeftClick(20, 20)]
    assert "1000 actions" in engine.requests[1].text and "at most 20" in engine.requests[1].text


def test_a_huge_text_is_refused_before_a_single_character_is_typed():
    result, engine, ex = run([call(action="type", text="a" * 1_000_000), call(action="type", text="ok")],
                             max_type_chars=2000)  # fmt: skip
    assert ex.actions == [A.Type("ok")]
    assert "1000000 characters" in engine.requests[1].text and "at most 2000" in engine.requests[1].text


@pytest.mark.parametrize(
    "reply, words",
    [
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": '
         + "[" * 100_000 + "}}</tool_call>", "nested too deeply"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": ['
         + "9" * 5000 + ", 5]}}</tool_call>", "too many digits"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": ['
         + "9" * 5000 + ".5, 5]}}</tool_call>", "finite number"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "answer", "text": "a \\ud800 b"}}</tool_call>',
         "lone surrogate"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "type", "text": "\\udfff"}}</tool_call>',
         "lone surrogate"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "key", "keys": ["ctrl", "\\ud83d"]}}</tool_call>',
         "lone surrogate"),
    ],
)  # fmt: skip
def test_absurd_json_is_a_parse_error_observation_and_the_trace_ends(tmp_path, reply, words):
    result, engine, ex = run([reply], trace=TraceWriter(tmp_path / "t"))
    assert result.status == "success" and ex.actions == []
    assert words in engine.requests[1].text
    trace = read_trace(tmp_path / "t")
    assert words in trace.steps[0]["error"]
    assert trace.end["status"] == "success"


class Strict(RecordingExecutor):
    """Refuses what a US keyboard on X11 cannot do, as the desktop executor's own checks would."""

    def validate(self, action):
        from qvl_agent.act.desktop import DesktopExecutor

        class Keyboard:  # pyautogui's own key list, without importing pyautogui (it needs a display)
            @staticmethod
            def isValidKey(key):
                return key.isascii() and (len(key) == 1 or key in {"enter", "ctrl", "alt", "shift", "tab"})

        DesktopExecutor(input_backend=Keyboard()).validate(action)

    def execute(self, action, shot):
        self.validate(action)  # the real executors check before they act
        return super().execute(action, shot)


def test_the_dry_run_refuses_exactly_what_the_real_executor_refuses():
    replies = [call(action="key", keys=["hyper"]), call(action="type", text="naïve"), call(action="type", text="ok")]
    _, dry_engine, dry = run(replies, mode="dry-run", executor=DryRunExecutor(Strict([screen()])))
    _, real_engine, _ = run(replies, executor=Strict([screen()]))
    observations = [r.text for r in dry_engine.requests[1:3]]
    assert observations == [r.text for r in real_engine.requests[1:3]]
    assert "Unknown key 'hyper'" in observations[0] and "Cannot type 'ï'" in observations[1]
    assert dry.inner.recorded == [] and [a for a, _ in dry.done] == [A.Type("ok")]


def test_control_characters_never_reach_the_terminal_prompt(capsys):
    import io

    evil = A.Key(("\x1b]0;owned\x07", "\n", "ctrl"))
    terminal_confirm(evil, [], screen(), stream=io.StringIO("n\n"))
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.count("\n") == 0
    assert "\\x1b]0;owned\\x07" in err
    assert "\x1b" not in A.describe(A.Type("\x1b[2J")) and "\u202e" not in A.describe(A.Answer("a\u202eb"))


def test_a_key_named_newline_cannot_break_out_of_an_exported_comment():
    url = "http://127.0.0.1:8000/"
    steps = [{"kind": "key", "ok": True, "detail": {"url": url, "keys": "Enter"},
              "describe": "key \nimport os\nos.system('touch /tmp/owned')"}]  # fmt: skip
    source = compile_run(url, steps).source
    ast.parse(source)
    check_script(source)
    lines = [line.strip() for line in source.splitlines()]
    clean = compile_run(url, [{**steps[0], "describe": "key Enter"}]).source.splitlines()
    assert lines.count("import os") == [line.strip() for line in clean].count("import os")
    assert not any(line.startswith("os.system") for line in lines)
    assert any(line.startswith("# step 1: key \\nimport os") for line in lines)
