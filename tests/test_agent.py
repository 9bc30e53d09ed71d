"""The agent loop with the replay engine and a recording executor (no display needed)."""

from __future__ import annotations

import json
import sys
import threading

from qvl_agent import actions as A
from qvl_agent.act.guard import Guard
from qvl_agent.agent import Agent
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from qvl_agent.trace import TraceWriter, read_trace
from tests.support.recording import RecordingExecutor


def screen(n: int, width: int = 200, height: int = 100) -> Screenshot:
    return Screenshot(bytes([n % 256, 0, 0, 0]) * (width * height), width, height, "BGRA", left=1000, top=50)


def call(**args) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"


def make(replies, screens=None, mode="auto", **kw):
    engine = ReplayEngine(replies)
    executor = RecordingExecutor(screens or [screen(i) for i in range(1, 30)])
    guard = Guard(mode=mode, **{k: kw.pop(k) for k in ("confine", "confirm") if k in kw})
    return engine, executor, Agent(engine, executor, guard, **kw)


def test_actions_run_in_order_at_the_right_pixels_and_terminate_ends_the_run():
    engine, ex, agent = make(
        [
            call(action="left_click", coordinate=[500, 500]) + call(action="type", text="hi"),
            call(action="key", keys=["ctrl", "s"]),
            call(action="terminate", status="success"),
        ]
    )
    result = agent.run("Save the note")
    assert (result.status, result.steps) == ("success", 3)
    assert ex.actions == [A.LeftClick(500, 500), A.Type("hi"), A.Key(("ctrl", "s"))]
    assert ex.recorded[0].pixels == ((1100, 100),)  # region offset (1000, 50) + half of 200x100
    # The model saw the tool schema with Qwen3-VL's 1000x1000 screen, the task first, then observations.
    assert "The screen's resolution is 1000x1000" in engine.requests[0].system
    assert '"name": "computer_use"' in engine.requests[0].system
    assert engine.requests[0].text == "Save the note"
    assert "left_click at (500, 500)" in engine.requests[1].text
    # Each step showed the newest screenshot; one session carried the whole run (append-only).
    assert [r.image_hashes for r in engine.requests] == [[screen(i).content_hash] for i in (1, 2, 3)]
    assert len({r.session_id for r in engine.requests}) == 1


def test_answer_ends_with_success_and_the_text():
    _, _, agent = make([call(action="answer", text="42") + call(action="terminate", status="success")])
    result = agent.run("What is the answer?")
    assert (result.status, result.answer) == ("success", "42")


def test_terminate_failure_is_a_failure():
    _, _, agent = make([call(action="terminate", status="failure")])
    assert agent.run("Impossible").status == "failure"


def test_a_broken_reply_is_shown_to_the_model_and_retries_are_bounded():
    engine, ex, agent = make(
        ["I would click it.", call(action="left_click"), "nothing", "still nothing"], max_retries=2
    )
    result = agent.run("Click it")
    assert result.status == "failure"
    assert "no tool call" in engine.requests[1].text
    assert 'left_click needs "coordinate"' in engine.requests[2].text
    assert ex.actions == []


def test_off_screen_and_confined_points_are_refused_and_reported():
    from qvl_agent.image import Region

    engine, ex, agent = make(
        [
            call(action="left_click", coordinate=[1200, 10]),
            call(action="left_click", coordinate=[900, 900]),
            call(action="left_click", coordinate=[100, 100]),
            call(action="terminate", status="success"),
        ],
        confine=Region(1000, 50, 100, 50),
    )
    assert agent.run("Click").status == "success"
    assert "off the screen" in engine.requests[1].text
    assert "outside the allowed area" in engine.requests[2].text
    assert ex.actions == [A.LeftClick(100, 100)]


def test_max_steps_is_a_limit():
    _, ex, agent = make([call(action="mouse_move", coordinate=[1, 1])] * 5, max_steps=3)
    result = agent.run("Wander")
    assert (result.status, result.steps, len(ex.actions)) == ("limit", 3, 3)


def test_replay_running_out_is_an_error_and_the_trace_keeps_every_step(tmp_path):
    _, _, agent = make([call(action="left_click", coordinate=[10, 10])], trace=TraceWriter(tmp_path / "t"))
    result = agent.run("Click twice")
    assert result.status == "error" and "no more recorded replies" in result.message
    trace = read_trace(tmp_path / "t")
    assert [s["step"] for s in trace.steps] == [1, 2]
    assert trace.steps[0]["results"][0]["pixels"] == [[1002, 51]]
    assert "no more recorded replies" in trace.steps[1]["error"]
    assert all((tmp_path / "t" / s["screenshot"]).stat().st_size > 0 for s in trace.steps)
    assert trace.end["status"] == "error"


def test_confirm_mode_asks_and_a_no_stops_before_anything_runs():
    asked = []

    def confirm(action, pixels, shot):
        asked.append((action, pixels))
        return len(asked) == 1

    _, ex, agent = make(
        [call(action="left_click", coordinate=[500, 500]) + call(action="type", text="x")],
        mode="confirm",
        confirm=confirm,
    )
    result = agent.run("Click and type")
    assert result.status == "stopped" and "declined" in result.message
    assert asked == [(A.LeftClick(500, 500), [(1100, 100)]), (A.Type("x"), [])]
    assert ex.actions == [A.LeftClick(500, 500)]


def test_stop_between_actions_of_one_reply():
    holder = {}

    def confirm(action, pixels, shot):
        if isinstance(action, A.Type):
            holder["agent"].guard.stop("stop pressed")
        return True

    _, ex, agent = make(
        [
            call(action="left_click", coordinate=[1, 1])
            + call(action="type", text="a")
            + call(action="key", keys=["enter"])
        ],
        mode="confirm",
        confirm=confirm,
    )
    holder["agent"] = agent
    result = agent.run("x")
    assert result.status == "stopped"
    assert ex.actions == [A.LeftClick(1, 1)]


def test_stop_wakes_a_wait_at_once():
    _, ex, agent = make([call(action="wait", time=30) + call(action="left_click", coordinate=[1, 1])])
    threading.Timer(0.2, agent.guard.stop).start()
    result = agent.run("Wait")
    assert result.status == "stopped" and ex.actions == []


def test_context_is_rebuilt_every_few_steps_not_every_step():
    replies = [call(action="mouse_move", coordinate=[i, i]) for i in range(1, 9)] + [
        call(action="terminate", status="success")
    ]
    engine, _, agent = make(replies, max_images=4, keep_images=2)
    assert agent.run("Move").status == "success"
    sessions = [r.session_id for r in engine.requests]
    # 9 steps with a 4-screenshot budget: rebuilt at step 5 (keeping 1 old + the new) and step 8.
    changes = [i + 1 for i in range(1, len(sessions)) if sessions[i] != sessions[i - 1]]
    assert changes == [5, 8]
    assert agent.rebuilds == 2


def test_a_stop_just_before_the_model_call_ends_the_run_without_generating_a_reply():
    engine = ReplayEngine([call(action="left_click", coordinate=[500, 500])] * 3, delay_s=0.5)
    executor = RecordingExecutor([screen(i) for i in range(1, 5)])
    guard = Guard(mode="auto")

    def on_event(event):
        if event.kind == "step":  # after the step's own stop check, right before the model is asked
            guard.stop("stop pressed")

    result = Agent(engine, executor, guard, on_event=on_event).run("Click")
    assert result.status == "stopped" and result.message == "stop pressed"
    assert engine.position == 0  # no reply was generated (and none of its pieces waited for)
    assert executor.actions == []


def _prompt_pipe(data: bytes = b"", close: bool = False):
    import os

    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    if close:
        os.close(write_fd)
        write_fd = None
    return open(read_fd, encoding="utf-8", closefd=True), write_fd


def test_terminal_prompt_takes_yes_no_and_end_of_input_as_no():
    from qvl_agent.act.guard import terminal_confirm

    shot = screen(1)
    answers, _ = _prompt_pipe(b"y\nno\nYES\n", close=True)
    with answers:
        got = [terminal_confirm(A.LeftClick(1, 1), [(1, 1)], shot, stream=answers) for _ in range(4)]
    assert got == [True, False, True, False]  # the fourth question meets the end of input: a no
    closed, _ = _prompt_pipe(close=True)
    closed.close()
    assert terminal_confirm(A.LeftClick(1, 1), [(1, 1)], shot, stream=closed) is False


def test_the_stop_switch_ends_a_waiting_terminal_prompt_without_enter(capsys):
    import os

    from qvl_agent.act.guard import StopSwitch, terminal_confirm

    switch = StopSwitch()
    stdin, write_fd = _prompt_pipe(b"y")  # a half-typed answer, no Enter
    threading.Timer(0.3, switch.stop, args=("hotkey pressed",)).start()
    try:
        with stdin:
            assert terminal_confirm(A.LeftClick(1, 1), [(1, 1)], screen(1), switch=switch, stream=stdin) is False
    finally:
        os.close(write_fd)
    assert "Do it? [y/N]" in capsys.readouterr().err


def test_confirm_mode_on_the_terminal_stops_the_run_when_the_stop_switch_is_set(monkeypatch):
    import os

    stdin, write_fd = _prompt_pipe()
    monkeypatch.setattr(sys, "stdin", stdin)
    _, ex, agent = make([call(action="left_click", coordinate=[500, 500])], mode="confirm")
    threading.Timer(0.3, agent.guard.stop, args=("hotkey pressed",)).start()
    try:
        result = agent.run("Click")
    finally:
        os.close(write_fd)
        stdin.close()
    assert result.status == "stopped" and result.message == "hotkey pressed"
    assert ex.actions == []
