"""Take over and hand back: the person pauses a run between steps, acts, and hands it back.

The loop's side with the replay engine and a recording executor (what the model is told, where the pause
falls, the stop switch while paused); then `qvl-agent browse --headed` end to end on the virtual display,
as a person would use it: the take-over hotkey and the person's clicks and typing sent with xdotool, the
model's call_user with its reason on the terminal, in the banner, the trace and the report, the stop
hotkey ending a paused run, and the export of a mixed run replayed in the sandbox with the password
nowhere in the run folder or the script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from qvl_agent.act.guard import Guard
from qvl_agent.act.recorder import MOVED_ON
from qvl_agent.actions import CallUser
from qvl_agent.agent import Agent
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from qvl_agent.parse import parse_actions
from qvl_agent.takeover import TakeOver, what_the_person_did
from qvl_agent.trace import TraceWriter, read_trace
from tests.conftest import ROOT
from tests.pages.helpers import ENV, WINDOWED_ENV, call, to_grid
from tests.pages.server import PageServer
from tests.support.recording import RecordingExecutor
from tests.test_record import PASSWORD, Person, centres, viewport_origin, wait_for

# --- the loop -------------------------------------------------------------------------------------------


def screen(n: int) -> Screenshot:
    return Screenshot(bytes([n % 256, 1, 2, 0]) * (64 * 48), 64, 48, "BGRA")


class FakePerson:
    """Stands in for the browser's capture: writes `steps` as the person's when the pause starts."""

    def __init__(self, trace: TraceWriter, steps: list[dict], on_start=lambda: None):
        self.trace, self.steps, self.on_start = trace, steps, on_start
        self.first_step = 0
        self.written: list[dict] = []

    def start(self, first_step: int) -> None:
        self.first_step = first_step
        for n, step in enumerate(self.steps, start=first_step):
            record = {"step": n, "by": "person", "reply": "", **step}
            self.trace.step(record)
            self.written.append(record)
        self.on_start()

    def pump(self, seconds: float) -> None:
        threading.Event().wait(seconds / 10)

    def stop(self) -> list[dict]:
        return self.written


PERSON_STEPS = [
    {
        "actions": [{"action": "left_click", "coordinate": [500, 500]}],
        "results": [{"action": 'click the "Sign in" button', "ok": True, "detail": {"url": "http://h/a"}}],
    },
    {
        "actions": [{"action": "type", "text": "{{PASSWORD}}"}],
        "results": [{"action": 'type into the "Password" textbox', "ok": True, "detail": {"url": "http://h/b"}}],
    },
]


def test_the_hotkey_pauses_after_the_step_and_the_model_is_told_what_the_person_did(tmp_path):
    trace = TraceWriter(tmp_path / "run")
    guard = Guard(mode="auto")
    takeover = TakeOver(guard.switch)
    person = FakePerson(trace, PERSON_STEPS, on_start=takeover.hand_back)
    takeover.person = person
    engine = ReplayEngine([call(action="wait", time=0), call(action="terminate", status="success")])
    shown = []
    takeover.show = lambda state, reason: shown.append((state, reason))
    executor = RecordingExecutor([screen(i) for i in range(5)])
    agent = Agent(engine, executor, guard, trace, takeover=takeover, settle_timeout_s=0)
    takeover.request()  # pressed during step 1: the pause comes once it has ended
    assert agent.run("Sign in").status == "success"
    trace.close()

    assert person.first_step == 2 and shown == [("paused", ""), ("resumed", "")]
    assert "call_user" in engine.requests[0].text  # described in the task turn, the system prompt unchanged
    told = engine.requests[1].text
    assert told.startswith("wait 0 s: waited 0 s")
    assert (
        'The person took over and: clicked the "Sign in" button; went to "http://h/b"; typed into the "Password" '
        "textbox (a secret). They handed the run back to you."
    ) in told
    steps = read_trace(tmp_path / "run").steps
    who = [(s["step"], s.get("by", "agent")) for s in steps]
    assert who == [(1, "agent"), (2, "person"), (3, "person"), (4, "agent")]


def test_call_user_pauses_with_its_reason_and_the_stop_switch_ends_the_pause(tmp_path):
    trace = TraceWriter(tmp_path / "run")
    guard = Guard(mode="auto")
    takeover = TakeOver(guard.switch, where="the desktop")
    shown = []

    def show(state, reason):
        shown.append((state, reason))
        if state == "paused":
            guard.switch.stop("The emergency stop hotkey was pressed.")

    takeover.show = show
    engine = ReplayEngine([call(action="call_user", text="Solve the CAPTCHA, please")])
    agent = Agent(engine, RecordingExecutor([screen(1)]), guard, trace, takeover=takeover, settle_timeout_s=0)
    result = agent.run("Sign up")
    trace.close()
    assert result.status == "stopped" and "emergency stop" in result.message
    assert shown == [("paused", "Solve the CAPTCHA, please"), ("resumed", "")]
    [step] = read_trace(tmp_path / "run").steps
    assert step["results"][0]["message"] == "the person was asked to take over: Solve the CAPTCHA, please"


def test_call_user_parses_and_without_a_person_it_is_refused_to_the_model():
    assert parse_actions(call(action="call_user", text="2FA code")) == [CallUser("2FA code")]
    engine = ReplayEngine([call(action="call_user", text="help"), call(action="terminate", status="failure")])
    agent = Agent(engine, RecordingExecutor([screen(1), screen(2)]), Guard(mode="auto"), settle_timeout_s=0)
    assert agent.run("x").status == "failure"
    assert "call_user" not in engine.requests[0].text  # not offered where no one can take over
    assert "No person can take over in this run" in engine.requests[1].text


def test_the_words_when_nothing_was_recorded():
    assert what_the_person_did([], "", "the desktop") == (
        "The person took over and: acted on the desktop (what they did was not recorded). "
        "They handed the run back to you."
    )
    assert "did nothing that was recorded" in what_the_person_did([], "CAPTCHA")


# --- end to end: browse --headed on the virtual display ---------------------------------------------------


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def _x(*args: str) -> None:
    subprocess.run(["xdotool", *args], check=True, timeout=30, env=dict(os.environ))


def start_browse(tmp_path: Path, url: str, replies: list[str], task: str, *extra: str) -> subprocess.Popen:
    replay = tmp_path / "replies.json"
    replay.write_text(json.dumps(replies))
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", QVL_CONFIG_DIR=str(tmp_path / "config"), **WINDOWED_ENV
    )
    args = ["--url", url, "--headed", "--engine", f"replay:{replay}", "--trace-dir", str(tmp_path / "trace"), *extra]
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "qvl_agent", "browse", *args, task],
            env=env, cwd=ROOT, stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
    wait_for(lambda: "takes over; press it again" in said(tmp_path) or proc.poll() is not None, "the run to start")
    assert proc.poll() is None, said(tmp_path)
    return proc


def window_named(name: str) -> bool:
    found = subprocess.run(["xdotool", "search", "--name", name], capture_output=True, env=dict(os.environ))
    return found.returncode == 0


def said(tmp_path: Path) -> str:
    return (tmp_path / "out.txt").read_text() + (tmp_path / "err.txt").read_text()


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


@pytest.mark.browser
@pytest.mark.display
@pytest.mark.slow
def test_a_person_takes_over_signs_in_and_hands_back_and_the_mixed_run_replays(x_display, tmp_path, server):
    server.site = "a"
    server.clear()
    signin, orders = f"{server.url}/site/rec-signin.html", f"{server.url}/site/rec-orders.html"
    form = centres(signin, ["#user", "#pw", "#go"])
    row = centres(orders, ["tr:nth-of-type(2) button"])
    dialog = centres(orders, ["#yes"], prepare="tr:nth-of-type(2) button")
    replies = [
        call(action="wait", time=5),  # the person presses the hotkey during this step
        "The order list is shown.\n" + call(action="left_click", coordinate=to_grid(*row["tr:nth-of-type(2) button"])),
        call(action="left_click", coordinate=to_grid(*dialog["#yes"])),
        call(action="terminate", status="success"),
    ]
    export = tmp_path / "out.py"
    proc = start_browse(tmp_path, signin, replies, "Cancel order 1002", "--export", str(export))
    try:
        wait_for(lambda: "step 1: wait 5 s" in said(tmp_path), "the first step")
        _x("key", "ctrl+alt+t")
        wait_for(lambda: "paused: you have control" in said(tmp_path), "the pause")
        person = Person(viewport_origin())
        person.click(form["#user"])
        person.type("ada")
        person.click(form["#pw"])
        person.type(PASSWORD)
        person.click(form["#go"])
        wait_for(lambda: server.records("signin"), "the sign-in to post")
        wait_for(lambda: window_named("Your orders"), "the orders page")
        _x("key", "ctrl+alt+t")  # hand back
        assert finish(proc) == 0, said(tmp_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    out = said(tmp_path)
    assert "Ctrl+Alt+T takes over; press it again to hand back." in out
    assert "handed back: the agent goes on." in out
    assert server.records("signin") == [{"user": "ada", "pw": PASSWORD, "remember": False}]
    assert server.records("cancel") == [{"order": "#1002"}]

    steps = read_trace(tmp_path / "trace").steps
    by = [s.get("by", "agent") for s in steps]
    assert by[0] == "agent" and by[-1] == "agent" and "person" in by
    person_steps = [s for s in steps if s.get("by") == "person"]
    assert [s["step"] for s in person_steps] == list(range(2, 2 + len(person_steps)))  # after the agent's step 1
    assert [s["actions"][0]["action"] for s in person_steps][:4] == ["left_click", "type", "left_click", "type"]
    for step in person_steps:  # each with its element, and a picture unless the loaded recorder was behind
        assert step["results"][0]["detail"].get("locator"), step
        assert step.get("screenshot") or step.get("no_screenshot") == MOVED_ON, (step, out)
    assert any(step.get("screenshot") for step in person_steps)
    # What the model was sent next: the person's work in words (the step's observation is the request's text).
    told = steps[len(person_steps) + 1]["observation"]
    assert told.startswith("wait 5 s: waited 5 s")
    assert 'The person took over and: clicked the "User name" textbox; typed into the "User name" textbox;' in told
    assert 'typed into the "Password" textbox (a secret); clicked the "Sign in" button' in told
    assert "went to " + json.dumps(orders) in told and "ctrl" not in told.lower()

    report = (tmp_path / "trace" / "report.html").read_text()
    assert report.count(">by the person<") == len(person_steps) and ">by the agent<" in report
    source = export.read_text()
    assert 'os.environ["QVL_SECRET_PASSWORD"]' in source
    assert 'get_by_role("textbox", name="User name", exact=True).fill("ada")' in source
    assert 'get_by_role("button", name="Yes, cancel it", exact=True).click()' in source
    for path in [export, *(tmp_path / "trace").iterdir()]:
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), f"the password is in {path.name}"

    server.clear()
    env = dict(os.environ, PYTHONPATH=str(ROOT), QVL_CONFIG_DIR=str(tmp_path / "config"), **ENV)
    env["QVL_SECRET_PASSWORD"] = PASSWORD
    again = subprocess.run(
        [sys.executable, "-m", "qvl_agent", "replay", str(export), "-o", str(tmp_path / "replayed")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records("signin") == [{"user": "ada", "pw": PASSWORD, "remember": False}]
    assert server.records("cancel") == [{"order": "#1002"}]


@pytest.mark.browser
@pytest.mark.display
@pytest.mark.slow
def test_call_user_shows_its_reason_and_the_stop_hotkey_ends_the_paused_run(x_display, tmp_path, server):
    """The page keeps calling the recording binding with forged events: none becomes a person's step."""
    url = f"{server.url}/forge.html"
    reason = "Solve the CAPTCHA, please"
    proc = start_browse(tmp_path, url, [call(action="call_user", text=reason)], "Sign up")
    try:
        wait_for(lambda: f"paused ({reason}): you have control" in said(tmp_path), "the pause")
        # The banner, a window of its own outside the page, says it too.
        wait_for(lambda: window_named("qvl-agent: paused"), "the banner")
        wait_for(lambda: server.records("forged"), "the page's forged calls while the run is paused")
        _x("key", "ctrl+alt+Escape")
        assert finish(proc) == 1, said(tmp_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert "stopped: The emergency stop hotkey Ctrl+Alt+Esc was pressed." in said(tmp_path)
    steps = read_trace(tmp_path / "trace").steps
    assert [s.get("by", "agent") for s in steps] == ["agent"]  # nothing forged, and the hotkey is no step
    assert steps[0]["results"][0]["message"] == f"the person was asked to take over: {reason}"
    assert reason in (tmp_path / "trace" / "report.html").read_text()
