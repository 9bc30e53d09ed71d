"""End to end on a virtual display with a window manager: `qvl-agent run --engine replay:FILE` drives a
real PySide6 window with the real pointer and keyboard; the app's own state proves where input landed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qvl_agent.image import Screenshot, to_model
from qvl_agent.trace import read_trace
from tests.conftest import ROOT, run_cli
from tests.support.display import display_works

pytestmark = [
    pytest.mark.display,
    pytest.mark.skipif(
        not shutil.which("Xvfb") and not display_works(os.environ.get("DISPLAY", "")),
        reason="needs Xvfb (apt install xvfb jwm xdotool) or a live X display",
    ),
]

SCREEN = Screenshot(b"\0" * 4, 1, 1, "BGRA")  # replaced by the real screen size in `app`


class FormApp:
    """The test form running as its own process on the virtual display."""

    def __init__(self, tmp: Path):
        self.geometry_path, self.state_path = tmp / "geometry.json", tmp / "state.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="xcb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.form_app", str(self.geometry_path), str(self.state_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while not self.geometry_path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"The test form exited: {self.proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("The test form did not show its window within 30 s.")
            time.sleep(0.05)
        self.widgets = json.loads(self.geometry_path.read_text())["widgets"]
        from qvl_agent import capture

        self.screen = capture.grab(monitor=1)

    def center(self, name: str) -> list[int]:
        """Where the model would point at the widget's centre, as whole numbers on the 0-1000 grid."""
        x, y, w, h = self.widgets[name]
        mx, my = to_model(x + w // 2, y + h // 2, self.screen)
        return [round(mx), round(my)]

    def checkbox(self) -> list[int]:
        # The clickable box sits at the left end of a QCheckBox; aim a little right of its left edge.
        x, y, w, h = self.widgets["agree"]
        mx, my = to_model(x + 8, y + h // 2, self.screen)
        return [round(mx), round(my)]

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def wait_state(self, predicate, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if predicate(state):
                return state
            time.sleep(0.05)
        raise AssertionError(f"the form never reached the expected state; it holds {self.state()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def app(x_display, tmp_path):
    form = FormApp(tmp_path)
    yield form
    form.close()


def call(**args) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"


def replay(tmp: Path, replies: list[str]) -> str:
    path = tmp / "replies.json"
    path.write_text(json.dumps(replies))
    return f"replay:{path}"


def pointer() -> tuple[int, int]:
    out = subprocess.run(["xdotool", "getmouselocation", "--shell"], capture_output=True, text=True, check=True)
    values = dict(line.split("=", 1) for line in out.stdout.split())
    return int(values["X"]), int(values["Y"])


def start_run(engine: str, trace_dir: Path, output=subprocess.PIPE) -> subprocess.Popen:
    """`qvl-agent run --yes` in the background, as a person would start it from a terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "qvl_agent", "run", "--engine", engine, "--yes", "--trace-dir", str(trace_dir), "Go"],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"),
        stdout=output,
        stderr=output,
        text=True,
    )


def test_recorded_clicks_and_typing_land_in_the_real_window(app, tmp_path):
    engine = replay(
        tmp_path,
        [
            "Thought: the name field is empty.\n"
            + call(action="left_click", coordinate=app.center("name"))
            + call(action="type", text="Ada Lovelace"),
            call(action="left_click", coordinate=app.center("email")) + call(action="type", text="ada@example.org"),
            call(action="left_click", coordinate=app.checkbox()),
            call(action="left_click", coordinate=app.center("submit")),
            call(action="terminate", status="success"),
        ],
    )
    trace_dir = tmp_path / "trace"
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(trace_dir), "Fill in the form and submit it")
    assert done.returncode == 0, done.stderr
    state = app.state()
    assert state["name"] == "Ada Lovelace"
    assert state["email"] == "ada@example.org"
    assert state["agree"] is True
    assert state["submitted"] == [{"name": "Ada Lovelace", "email": "ada@example.org", "agree": True}]
    # The trace holds every step with its screenshot and the pixels each click went to.
    trace = read_trace(trace_dir)
    assert [s["step"] for s in trace.steps] == [1, 2, 3, 4, 5]
    assert all((trace_dir / s["screenshot"]).exists() for s in trace.steps)
    x, y, w, h = app.widgets["submit"]
    ((px, py),) = trace.steps[3]["results"][0]["pixels"]
    assert x <= px < x + w and y <= py < y + h
    assert trace.end["status"] == "success"
    shown = run_cli("trace", "show", str(trace_dir))
    assert shown.returncode == 0 and "left_click" in shown.stdout and "success" in shown.stdout


def test_dry_run_moves_nothing(app, tmp_path):
    subprocess.run(["xdotool", "mousemove", "37", "41"], check=True)
    before_pointer, before_state = pointer(), app.state()
    engine = replay(
        tmp_path,
        [
            call(action="left_click", coordinate=app.center("name")) + call(action="type", text="nope"),
            call(action="left_click", coordinate=app.checkbox()),
            call(action="terminate", status="success"),
        ],
    )
    done = run_cli("run", "--engine", engine, "--dry-run", "--trace-dir", str(tmp_path / "t"), "Fill it")
    assert done.returncode == 3, done.stderr  # a finished dry run: nothing was done
    assert "left_click" in done.stdout  # the person sees what would have been done, with pixels
    assert pointer() == before_pointer
    assert app.state() == before_state


def test_emergency_stop_during_a_wait_stops_before_the_next_action(app, tmp_path):
    engine = replay(
        tmp_path,
        [
            call(action="left_click", coordinate=app.center("name")) + call(action="type", text="abc"),
            call(action="wait", time=30) + call(action="left_click", coordinate=app.checkbox()),
            call(action="left_click", coordinate=app.center("submit")),
            call(action="terminate", status="success"),
        ],
    )
    trace_dir = tmp_path / "trace"
    proc = start_run(engine, trace_dir)
    try:
        app.wait_state(lambda s: s["name"] == "abc")
        # Step 1 is in the trace once its line is written; step 2 (the wait) comes right after it.
        deadline = time.monotonic() + 20
        while len(read_trace(trace_dir).steps) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        subprocess.run(["xdotool", "key", "ctrl+alt+Escape"], check=True)
        out, err = proc.communicate(timeout=15)  # far less than the 30 s wait: the stop woke it
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "stop" in err.lower()
    state = app.state()
    assert state["agree"] is False and state["submitted"] == []
    trace = read_trace(trace_dir)
    assert trace.end["status"] == "stopped" and "hotkey" in trace.end["message"]


def test_a_broken_reply_reaches_the_model_and_the_run_stops_cleanly(app, tmp_path):
    engine = replay(
        tmp_path,
        [
            "I think I should click on the Submit button.",
            call(action="terminate", status="failure"),
        ],
    )
    trace_dir = tmp_path / "trace"
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(trace_dir), "Submit")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    trace = read_trace(trace_dir)
    assert "no tool call" in trace.steps[0]["error"]
    # What the model was shown next: the parse error, with the next screenshot.
    assert "no tool call" in trace.steps[1]["observation"]
    assert trace.end["status"] == "failure"
    assert app.state()["submitted"] == []


def test_the_trace_is_complete_after_a_crash(app, tmp_path):
    engine = replay(
        tmp_path,
        [
            call(action="left_click", coordinate=app.center("name")) + call(action="type", text="x"),
            call(action="left_click", coordinate=app.center("email")) + call(action="type", text="y"),
            call(action="wait", time=30),
        ],
    )
    trace_dir = tmp_path / "trace"
    proc = start_run(engine, trace_dir, output=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (trace_dir / "trace.jsonl").exists() and len(read_trace(trace_dir).steps) >= 2:
                break  # step 3 (a 30 s wait) is running now
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no cleanup code runs
        proc.wait()
    trace = read_trace(trace_dir)
    assert [s["step"] for s in trace.steps][:2] == [1, 2]
    for s in trace.steps:
        assert (trace_dir / s["screenshot"]).stat().st_size > 0
    assert trace.end is None and trace.damaged_lines == 0
    shown = run_cli("trace", "show", str(trace_dir))
    assert shown.returncode == 0 and "did not finish" in shown.stdout


def test_confirm_mode_asks_on_the_terminal_and_a_no_goes_back_to_the_model(app, tmp_path):
    engine = replay(
        tmp_path,
        [
            call(action="left_click", coordinate=app.center("name")) + call(action="type", text="yes"),
            call(action="left_click", coordinate=app.checkbox()),
            call(action="terminate", status="success"),
        ],
    )
    # Without --yes every action waits for an answer: yes to the click and the typing, no to the checkbox,
    # which the model hears about and answers by ending the task.
    trace_dir = tmp_path / "t"
    done = run_cli("run", "--engine", engine, "--trace-dir", str(trace_dir), "Fill it", input="y\ny\nn\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Do it? [y/n/Q]") == 3 and "The person declined left_click" in done.stdout
    state = app.state()
    assert state["name"] == "yes" and state["agree"] is False
    assert "The person declined left_click" in read_trace(trace_dir).steps[2]["observation"]


def test_confirm_mode_ends_the_run_at_q_or_the_end_of_input(app, tmp_path):
    engine = replay(tmp_path, [call(action="left_click", coordinate=app.checkbox())] * 2)
    for i, answers in enumerate(("q\n", "")):
        done = run_cli("run", "--engine", engine, "--trace-dir", str(tmp_path / f"t{i}"), "Tick it", input=answers)
        assert done.returncode == 1, done.stderr
        assert "The person ended the run at: left_click" in done.stderr and done.stderr.count("Do it?") == 1
    assert app.state()["agree"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--monitor", "7"], "There is no monitor 7"),
        (["--monitor", "0"], "There is no monitor 0 to work on: use 1 (or --region"),
        (["--region", "1900,1000,500,500"], "lies outside the screen, which is 1920x1080 at (0, 0)."),
        (["--region", "10,10,0,5"], "positive width and height"),
        (["--max-steps", "0"], "--max-steps must be at least 1"),
        (["--engine", "replay:/no/such/file.json"], "No such replay file"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(x_display, tmp_path, args, message):
    done = run_cli("run", "--yes", "--trace-dir", str(tmp_path / "t"), *args, "Do something")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert "X11" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_under_a_region_a_scroll_or_drag_at_the_pointer_is_refused_and_the_window_outside_gets_nothing(app, tmp_path):
    """`--region` confines every action: a scroll without a point or a drag without a start would act where
    the pointer happens to be (here over the form, outside the region), so neither runs and the model is
    told why; the form sees no wheel turn and no button press."""
    x, y, w, h = app.widgets["name"]
    subprocess.run(["xdotool", "mousemove", str(x + w // 2), str(y + h // 2)], check=True)
    region = "0,0,300,200"  # the form sits at (400, 250) and beyond: outside
    inside = list(to_model(150, 100, app.screen))
    engine = replay(tmp_path, [
        call(action="scroll", pixels=-5),
        call(action="left_click_drag", coordinate=[round(v) for v in inside]),
        call(action="terminate", status="failure"),
    ])  # fmt: skip
    out = run_cli("run", "--engine", engine, "--yes", "--region", region, "--trace-dir", str(tmp_path / "t"), "Go")
    assert out.returncode == 1, out.stdout + out.stderr
    steps = read_trace(tmp_path / "t").steps
    errors = [s.get("error", "") for s in steps]
    assert sum("wherever the pointer is" in e for e in errors) == 2, errors
    assert "wherever the pointer is" in steps[1]["observation"]  # the model was told
    assert not any(r["ok"] for s in steps for r in s["results"] if not r["action"].startswith("terminate"))
    assert app.state()["pointer_events"] == {"wheel": 0, "press": 0}
    assert pointer() == (x + w // 2, y + h // 2)  # the pointer never moved either
