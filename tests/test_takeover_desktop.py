"""Take over and hand back on the desktop: the banner's lines reach the person's recorder, what they type
privately stays a secret for the rest of the run, and `qvl-agent run` end to end on the virtual display,
as a person would use it: the take-over hotkey and the person's clicks and typing sent with xdotool into
the test form, the banner's "Keep what I type private" box ticked with the pointer, the hotkey again to
hand back; and the model's call_user pausing with its reason until the banner's Hand back button.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qvl_agent.act.guard import StopSwitch
from qvl_agent.image import Region
from qvl_agent.secrets import Secrets
from qvl_agent.takeover import DesktopPerson, TakeOver, masks_what_the_person_typed
from qvl_agent.trace import read_trace
from qvl_agent.ui.banner import PauseNotice
from tests.conftest import ROOT
from tests.test_desktop_e2e import FormApp, call, replay

PASSWORD = "hunter2-Pa55"
BANNER = "qvl-agent: paused"

# --- the banner's lines and where they go ------------------------------------------------------------


class MarkedPerson:
    def __init__(self):
        self.marks: list[bool] = []
        self.areas: list[Region] = []
        self.secrets = Secrets({"PASSWORD": PASSWORD})

    def mark_private(self, on: bool) -> None:
        self.marks.append(on)

    def keep_out(self, area: Region, what: str = "banner") -> None:
        self.areas.append(area)


def test_the_banners_lines_reach_the_person_recorder_through_the_take_over(tmp_path):
    person = MarkedPerson()
    takeover = TakeOver(StopSwitch(), person)
    handed: list[bool] = []
    out = tmp_path / "terminal.txt"
    with open(out, "w") as stream:
        notice = PauseNotice("Ctrl+Alt+T", lambda: handed.append(True), banner=False, stream=stream,
                             on_private=takeover.mark_private, on_window=takeover.keep_out)  # fmt: skip
        for line in ("window 10 20 300 60\n", "private on\n", "private off\n", "hand back\n", "private maybe now\n"):
            notice._said(line.split())
    assert person.marks == [True, False] and handed == [True]
    assert person.areas == [Region(10, 20, 300, 60)]
    assert "what you type is kept private" in out.read_text()
    # A browser's capture takes no marks: the box is not offered, and a mark would do nothing.
    TakeOver(StopSwitch(), object()).mark_private(True)


def test_the_desktop_person_keeps_marks_told_before_its_recorder_starts_and_forgets_them_after():
    person = DesktopPerson(trace=None, hotkeys=["<ctrl>+<alt>+y"])
    assert person.secrets == Secrets() and person.hotkeys == ("<ctrl>+<alt>+y",)
    person.mark_private(True)
    person.keep_out(Region(0, 0, 10, 10))
    person.keep_out(Region(0, 1050, 30, 30), "tray")
    person.keep_out(Region(5, 5, 10, 10))  # the banner moved
    places = {"banner": Region(5, 5, 10, 10), "tray": Region(0, 1050, 30, 30)}
    assert (person._private, person._kept_out) == (True, places)
    assert person.stop() == [] and (person._private, person._kept_out) == (False, {})


def test_on_hand_back_the_agent_masks_what_the_person_typed_privately():
    class Agent:
        secrets = Secrets({"TOKEN": "tok-123"})

    person, agent = MarkedPerson(), Agent()
    takeover = TakeOver(StopSwitch(), person)
    masks_what_the_person_typed(takeover, agent)
    takeover.on_resume()
    assert agent.secrets.values == {"TOKEN": "tok-123", "PASSWORD": PASSWORD}
    assert agent.secrets.mask(f"the field holds {PASSWORD}") == "the field holds {{PASSWORD}}"


# --- `qvl-agent run` end to end -------------------------------------------------------------------------


def _x(*args: str) -> None:
    subprocess.run(["xdotool", *args], check=True, timeout=30, env=dict(os.environ))


def wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def banner_place() -> tuple[int, int, int, int] | None:
    """The banner's client window on the desktop (x, y, width, height), or None while it is not shown. (Asked
    of the X server: xdotool's own geometry counts the window manager's frame twice.)"""
    found = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", BANNER], capture_output=True, text=True)
    if found.returncode != 0:
        return None
    from Xlib import display

    connection = display.Display()
    try:
        window = connection.create_resource_object("window", int(found.stdout.split()[0]))
        shape = window.get_geometry()
        at = connection.screen().root.translate_coords(window, 0, 0)
        return at.x, at.y, shape.width, shape.height
    finally:
        connection.close()


def click_at(x: int, y: int) -> None:
    _x("mousemove", "--sync", str(x), str(y))
    _x("click", "1")
    time.sleep(0.7)  # past the double-click time: the next click is a click of its own


class Run:
    """`qvl-agent run --yes` in the background, its terminal in files."""

    def __init__(self, tmp_path: Path, replies: list[str], task: str):
        self.tmp, self.trace = tmp_path, tmp_path / "t"
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", QVL_CONFIG_DIR=str(tmp_path / "config"))
        args = ["run", "--engine", replay(tmp_path, replies), "--yes", "--trace-dir", str(self.trace), task]
        with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "qvl_agent", *args], env=env, cwd=ROOT,
                                         stdout=out, stderr=err, start_new_session=True)  # fmt: skip
        wait_for(lambda: "takes over; press it again" in self.said() or self.proc.poll() is not None, "the start")
        assert self.proc.poll() is None, self.said()

    def said(self) -> str:
        return (self.tmp / "out.txt").read_text() + (self.tmp / "err.txt").read_text()

    def wait_said(self, text: str) -> None:
        wait_for(lambda: text in self.said() or self.proc.poll() is not None, repr(text))
        assert text in self.said(), self.said()

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=120)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


@pytest.fixture
def form(x_display, tmp_path):
    app = FormApp(tmp_path)
    yield app
    app.close()


def widget_point(form: FormApp, name: str) -> tuple[int, int]:
    x, y, w, h = form.widgets[name]
    return x + w // 2, y + h // 2


@pytest.mark.display
@pytest.mark.slow
def test_a_person_takes_over_run_types_a_password_marked_private_and_hands_back(form, tmp_path):
    replies = [
        call(action="left_click", coordinate=form.center("name")) + call(action="type", text="Ada"),
        call(action="wait", time=5),  # the person presses the hotkey during this step
        "The form is filled.\n" + call(action="terminate", status="success"),
    ]
    run = Run(tmp_path, replies, "Fill in the form")
    try:
        run.wait_said("step 2: wait 5 s")
        _x("key", "ctrl+alt+t")
        run.wait_said("paused: you have control")
        wait_for(banner_place, "the banner")
        click_at(*widget_point(form, "email"))
        _x("type", "--delay", "30", "ada@example.org")
        time.sleep(0.3)
        bx, by, _, bh = banner_place()
        click_at(bx + 40, by + bh - 28)  # the "Keep what I type private" box, at the banner's lower left
        run.wait_said("what you type is kept private")
        click_at(*widget_point(form, "name"))
        _x("type", "--delay", "30", PASSWORD)
        form.wait_state(lambda s: PASSWORD in s["name"])  # it landed in the form, not in the banner
        time.sleep(0.3)
        _x("key", "ctrl+alt+t")  # hand back
        assert run.finish() == 0, run.said()
    finally:
        run.kill()
    out = run.said()
    assert "Ctrl+Alt+T takes over; press it again to hand back." in out
    assert "handed back: the agent goes on." in out
    assert form.state()["email"] == "ada@example.org"

    steps = read_trace(run.trace).steps
    person = [s for s in steps if s.get("by") == "person"]
    assert [s.get("by", "agent") for s in steps] == ["agent", "agent", *["person"] * len(person), "agent"]
    assert [s["actions"][0] for s in person] == [
        {"action": "left_click", "coordinate": person[0]["actions"][0]["coordinate"]},
        {"action": "type", "text": "ada@example.org"},
        {"action": "left_click", "coordinate": person[2]["actions"][0]["coordinate"]},
        {"action": "type", "text": "{{PASSWORD}}"},
    ]  # neither the banner's box nor the hotkey is a step
    assert [s["step"] for s in person] == [3, 4, 5, 6]
    assert all(s.get("screenshot") and (run.trace / s["screenshot"]).is_file() for s in person)
    told = steps[-1]["observation"]
    assert told.startswith("wait 5 s: waited 5 s")
    assert "The person took over and: clicked at" in told and "typed 'ada@example.org'" in told
    assert told.rstrip().endswith("typed something private. They handed the run back to you.")

    report = (run.trace / "report.html").read_text()
    assert report.count(">by the person<") == 4 and ">by the agent<" in report
    for path in run.trace.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path


@pytest.mark.display
@pytest.mark.slow
def test_the_models_call_user_pauses_run_with_its_reason_until_the_banners_button(form, tmp_path):
    reason = "Type the code from your phone, please"
    replies = [call(action="call_user", text=reason), call(action="terminate", status="success")]
    run = Run(tmp_path, replies, "Sign in")
    try:
        run.wait_said(f"paused ({reason}): you have control")
        wait_for(banner_place, "the banner")
        time.sleep(0.5)  # the banner has said where it is
        bx, by, bw, bh = banner_place()
        click_at(bx + bw - 40, by + bh - 28)  # Hand back, at the banner's lower right
        assert run.finish() == 0, run.said()
    finally:
        run.kill()
    assert "handed back: the agent goes on." in run.said()
    steps = read_trace(run.trace).steps
    assert [s.get("by", "agent") for s in steps] == ["agent", "agent"]  # the button's click is no step
    assert steps[0]["results"][0]["message"] == f"the person was asked to take over: {reason}"
    assert f"The person took over ({reason}) and: did nothing that was recorded" in steps[1]["observation"]
    assert reason in (run.trace / "report.html").read_text()
    assert read_trace(run.trace).end["status"] == "success"
