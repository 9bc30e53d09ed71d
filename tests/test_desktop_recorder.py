"""What the person does on the desktop while they hold a run becomes person steps (`act.desktop_recorder`).

The person is played by xdotool on the test's own X display: real pointer and key events, heard by the
recorder's real pynput listeners (nothing is mocked). The trace is polled with a deadline until the steps
are there; the recorder writes a click once its double-click time has passed, a typing run when the next
step starts.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from qvl_agent import capture
from qvl_agent.act.desktop_recorder import DesktopRecorder, _Event
from qvl_agent.image import Region
from qvl_agent.report import write_report
from qvl_agent.secrets import Secrets
from qvl_agent.step_words import describe_person_steps
from qvl_agent.trace import TraceWriter, read_trace

DEADLINE_S = 20.0  # a busy machine's worst case; the steps come within a second normally


def xdo(*args: str) -> None:
    subprocess.run(["xdotool", *args], check=True, env=dict(os.environ), timeout=30)


def wait_for_steps(run: Path, count: int) -> list[dict]:
    """The trace's steps once there are `count` of them (AssertionError past the deadline)."""
    deadline = time.monotonic() + DEADLINE_S
    steps: list[dict] = []
    while time.monotonic() < deadline:
        steps = read_trace(run).steps
        if len(steps) >= count:
            return steps
        time.sleep(0.05)
    raise AssertionError(f"{len(steps)} of {count} steps were recorded: {steps}")


@pytest.fixture
def recording(x_display, tmp_path):
    """A started recorder writing into a run folder, as the agent's trace would hold it; stopped afterwards."""
    made = []

    def start(secrets: Secrets | None = None, **kwargs) -> tuple[DesktopRecorder, Path]:
        run = tmp_path / f"run-{len(made)}"
        trace = TraceWriter(run)
        trace.start(task="the person's turn", executor="desktop")
        recorder = DesktopRecorder(trace, secrets or Secrets({}), first_step=4, **kwargs)
        made.append((recorder, trace))
        recorder.start()
        return recorder, run

    yield start
    for recorder, trace in made:
        recorder.stop()
        trace.close()


def grid(pixel: int, size: int) -> int:
    """The 0-1000 point of a pixel's centre, as the model writes it (`image.to_model`, rounded)."""
    return round((pixel + 0.5) * 1000 / size)


def test_clicks_scrolls_and_a_drag_are_person_steps_with_points_pixels_and_screenshots(recording):
    recorder, run = recording()
    screen = capture.list_monitors()[1]
    xdo("mousemove", "480", "270", "click", "1")
    xdo("mousemove", "960", "540", "click", "3")
    xdo("mousemove", "300", "700", "click", "--repeat", "2", "--delay", "80", "1")
    xdo("mousemove", "1200", "300", "click", "5", "click", "5", "click", "5")
    xdo("mousemove", "600", "600", "mousedown", "1", "mousemove", "700", "650", "mouseup", "1")
    steps = wait_for_steps(run, 5)
    written = recorder.stop()

    assert [s["step"] for s in steps] == [4, 5, 6, 7, 8]
    assert [s["actions"][0]["action"] for s in steps] == [
        "left_click", "right_click", "double_click", "scroll", "left_click_drag"
    ]  # fmt: skip
    assert [s["results"][0]["pixels"] for s in steps] == [
        [[480, 270]], [[960, 540]], [[300, 700]], [[1200, 300]], [[600, 600], [700, 650]]
    ]  # fmt: skip
    w, h = screen.width, screen.height
    for step in steps[:3]:
        ((px, py),) = step["results"][0]["pixels"]
        assert step["actions"][0]["coordinate"] == [grid(px, w), grid(py, h)]
    assert steps[3]["actions"][0] == {"action": "scroll", "pixels": -3, "coordinate": [grid(1200, w), grid(300, h)]}
    assert steps[4]["actions"][0] == {
        "action": "left_click_drag",
        "start_coordinate": [grid(600, w), grid(600, h)],
        "coordinate": [grid(700, w), grid(650, h)],
    }
    for step in steps:
        assert step["by"] == "person" and step["reply"] == ""
        result = step["results"][0]
        assert result["ok"] is True and result["message"] == "done by the person"
        assert step["screen"] == {"left": screen.left, "top": screen.top, "width": w, "height": h, "scale": 1.0}
        assert (run / step["screenshot"]).is_file()
    assert steps[0]["results"][0]["action"] == f"left_click at ({grid(480, w)}, {grid(270, h)})"
    assert [{k: v for k, v in s.items() if k not in ("type", "time")} for s in steps] == written

    html = write_report(run).read_text(encoding="utf-8")
    for kind in ("left_click", "right_click", "double_click", "scroll", "left_click_drag"):
        assert f'data-action="{kind}"' in html
    assert "done by the person" in html and "step-008.png" in html


def test_typing_is_one_type_step_and_enter_a_key_step(recording):
    recorder, run = recording()
    xdo("type", "--delay", "20", "hello")
    xdo("key", "Return")
    steps = wait_for_steps(run, 2)
    recorder.stop()
    assert [s["actions"] for s in steps] == [
        [{"action": "type", "text": "hello"}],
        [{"action": "key", "keys": ["enter"]}],
    ]
    assert steps[0]["results"][0]["detail"] == {"text": "hello"}
    assert all((run / s["screenshot"]).is_file() for s in steps)
    assert recorder.typed == {(4, 0): [["text", "hello"]]}
    assert recorder.next_step == 6
    assert describe_person_steps(steps) == "The person typed 'hello'; pressed Enter."


def test_text_typed_while_marked_private_reaches_neither_the_trace_nor_the_report(recording):
    password = "Qz7-wombat-Xy"
    recorder, run = recording()
    recorder.mark_private(True)
    xdo("type", "--delay", "20", password)
    xdo("key", "Return")
    steps = wait_for_steps(run, 2)
    recorder.stop()
    write_report(run)

    assert steps[0]["actions"] == [{"action": "type", "text": "{{PASSWORD}}"}]
    assert steps[0]["results"][0]["detail"]["private"] is True
    assert steps[1]["actions"] == [{"action": "key", "keys": ["enter"]}]
    assert recorder.secrets.values == {"PASSWORD": password}  # the export reads it from $QVL_SECRET_PASSWORD
    assert recorder.typed == {(4, 0): [["secret", "PASSWORD"]]}
    trace_bytes = (run / "trace.jsonl").read_bytes()
    assert b"{{PASSWORD}}" in trace_bytes
    for path in run.iterdir():
        assert password.encode() not in path.read_bytes(), path.name
        assert b"wombat" not in path.read_bytes(), path.name
    assert describe_person_steps(steps) == "The person typed something private; pressed Enter."


def test_typing_into_a_password_field_the_platform_names_is_private_and_a_known_secret_is_masked(recording):
    recorder, run = recording(Secrets({"TOKEN": "tok3n"}))
    recorder.password_focused = lambda: True  # what AT-SPI answers for a focused password field
    xdo("type", "--delay", "20", "hunter22")
    xdo("key", "Tab")
    wait_for_steps(run, 2)  # the typing run was written (it asked once, at its first key)
    recorder.password_focused = lambda: False
    xdo("type", "--delay", "20", "tok3n")
    xdo("key", "Return")
    steps = wait_for_steps(run, 4)
    recorder.stop()
    assert [s["actions"][0].get("text") for s in steps] == ["{{PASSWORD}}", None, "{{TOKEN}}", None]
    assert b"hunter22" not in (run / "trace.jsonl").read_bytes()
    assert b"tok3n" not in (run / "trace.jsonl").read_bytes()


def test_marking_private_while_typing_keeps_the_whole_run_out_and_unmarking_types_in_the_open_again(recording):
    recorder, run = recording()
    xdo("type", "--delay", "20", "abc")
    recorder.mark_private(True)  # before or after the worker saw "abc": that run is not written yet either way
    xdo("type", "--delay", "20", "def")
    xdo("key", "Return")
    wait_for_steps(run, 2)
    recorder.mark_private(False)
    xdo("type", "--delay", "20", "open")
    xdo("key", "Tab")
    steps = wait_for_steps(run, 4)
    recorder.stop()
    assert [s["actions"][0].get("text") for s in steps] == ["{{PASSWORD}}", None, "open", None]
    assert recorder.secrets.values == {"PASSWORD": "abcdef"}
    assert b"abcdef" not in (run / "trace.jsonl").read_bytes()


def test_a_click_off_the_grabbed_area_keeps_its_pixel_and_one_inside_gets_the_areas_point(recording):
    area = Region(100, 100, 400, 200)
    recorder, run = recording(grab=lambda monitor=None: capture.grab(region=area))
    xdo("mousemove", "300", "150", "click", "1")
    xdo("mousemove", "900", "900", "click", "3")
    xdo("key", "Escape")
    steps = wait_for_steps(run, 3)
    recorder.stop()
    inside, outside = steps[0], steps[1]
    assert inside["actions"][0] == {"action": "left_click", "coordinate": [grid(200, 400), grid(50, 200)]}
    assert inside["screen"] == {"left": 100, "top": 100, "width": 400, "height": 200, "scale": 1.0}
    assert outside["actions"][0] == {"action": "right_click"}
    assert outside["results"][0]["pixels"] == [[900, 900]]
    assert describe_person_steps(steps) == (
        f"The person clicked at ({grid(200, 400)}, {grid(50, 200)}) on the screen; "
        "right-clicked at pixel (900, 900), off the screenshot; pressed Escape."
    )
    assert "right_click at pixel (900, 900)" in write_report(run).read_text(encoding="utf-8")


def test_the_projects_hotkeys_are_not_recorded_and_other_chords_are(recording):
    recorder, run = recording(hotkeys=["<ctrl>+<alt>+<esc>", "<ctrl>+<alt>+t", "<ctrl>+<shift>+x"])
    xdo("key", "ctrl+alt+Escape", "ctrl+alt+t", "ctrl+shift+x", "ctrl+c", "shift+Tab")
    steps = wait_for_steps(run, 2)
    recorder.stop()
    assert [s["actions"][0] for s in read_trace(run).steps] == [
        {"action": "key", "keys": ["ctrl", "c"]},
        {"action": "key", "keys": ["shift", "tab"]},
    ]
    assert describe_person_steps(steps) == "The person pressed Ctrl+C; pressed Shift+Tab."


def test_the_default_hotkeys_are_those_of_the_settings_and_take_over():
    from qvl_agent.act.desktop_recorder import default_hotkeys

    assert {"<ctrl>+<alt>+<esc>", "<ctrl>+<alt>+q", "<ctrl>+<alt>+r", "<ctrl>+<alt>+t"} <= set(default_hotkeys())


def test_what_the_person_did_is_one_observation_for_desktop_and_browser_steps():
    def step(action: dict, words: str, detail: dict | None = None) -> dict:
        result = {"action": words, "ok": True, "message": "done by the person", "detail": detail or {}}
        return {"step": 1, "by": "person", "reply": "", "actions": [action], "results": [result]}

    page = {"url": "http://127.0.0.1/login", "locator": {"role": "button", "name": "Sign in"}}
    steps = [
        step({"action": "left_click", "coordinate": [412, 300]}, "left_click at (412, 300)", {"pixels": [[791, 324]]}),
        step({"action": "type", "text": "hello"}, "type 'hello'", {"text": "hello"}),
        step({"action": "key", "keys": ["enter"]}, "key enter", {"keys": ["enter"]}),
        step(
            {"action": "type", "text": "{{PASSWORD}}"}, "type '{{PASSWORD}}'", {"text": "{{PASSWORD}}", "private": True}
        ),
        step({"action": "double_click", "coordinate": [10, 20]}, "double_click at (10, 20)"),
        step({"action": "scroll", "pixels": -3, "coordinate": [500, 500]}, "scroll -3 at (500, 500)"),
        step({"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [3, 4]}, "left_click_drag"),
        step({"action": "left_click", "coordinate": [600, 80]}, 'click the "Sign in" button', page),
        step({"action": "type", "text": "ann"}, 'type into the "Email" textbox', page),
        step({"action": "type", "text": "{{PASSWORD}}"}, 'type into the "Password" textbox', page),
        step({"action": "key", "keys": ["ctrl", "c"]}, 'press Control+c on the "Email" textbox', page),
        step({"action": "left_click"}, 'choose "Express" in the "Shipping" combobox', page),
    ]
    assert describe_person_steps(steps) == (
        "The person clicked at (412, 300) on the screen; typed 'hello'; pressed Enter; typed something private; "
        "double-clicked at (10, 20) on the screen; scrolled down 3 wheel clicks at (500, 500); "
        'dragged from (1, 2) to (3, 4); clicked the "Sign in" button; typed \'ann\' into the "Email" textbox; '
        'typed something private into the "Password" textbox; pressed Control+c on the "Email" textbox; '
        'chose "Express" in the "Shipping" combobox.'
    )
    assert describe_person_steps([]) == "The person did nothing the run could record."
    many = describe_person_steps([steps[0]] * 33)
    assert many.endswith("; and 3 more steps.")


def _fed_recorder(tmp_path) -> tuple[TraceWriter, DesktopRecorder]:
    """A run's trace and a recorder whose screen is a blank 200x100 picture, for `_stamped_events`."""
    from qvl_agent.image import Screenshot

    trace = TraceWriter(tmp_path / "run")
    trace.start(task="the person's turn", executor="desktop")
    shot = Screenshot(bytes(4 * 200 * 100), 200, 100, "BGRA")
    return trace, DesktopRecorder(trace, Secrets({}), first_step=1, grab=lambda monitor=None: shot)


def _stamped_events(recorder: DesktopRecorder, events) -> list[dict]:
    """Feed events straight to the recorder's worker (no listeners, no display) and stop it."""
    recorder._start_worker()
    for event in events:
        recorder._events.put(event)
    return recorder.stop()


def test_events_heard_on_two_threads_are_written_in_the_order_they_were_heard(tmp_path):
    trace, recorder = _fed_recorder(tmp_path)
    now = time.monotonic()
    # The keyboard's thread got its events onto the queue before the pointer's, though they came later.
    written = _stamped_events(
        recorder,
        [
            _Event("key", now + 0.010, char="h"),
            _Event("key", now + 0.011, char="i"),
            _Event("key", now + 0.012, name="enter"),
            _Event("press", now, x=50, y=40, button="left"),
            _Event("release", now + 0.002, x=50, y=40, button="left"),
        ],
    )
    trace.close()
    assert [r["actions"][0]["action"] for r in written] == ["left_click", "type", "key"]
    assert written[1]["actions"][0]["text"] == "hi" and [r["step"] for r in written] == [1, 2, 3]
    assert [s["actions"] for s in read_trace(tmp_path / "run").steps] == [r["actions"] for r in written]


def test_presses_on_the_banner_are_no_steps_but_end_a_typing_run(tmp_path):
    trace, recorder = _fed_recorder(tmp_path)
    recorder.keep_out([Region(100, 0, 100, 30)])
    now = time.monotonic()
    written = _stamped_events(
        recorder,
        [
            _Event("key", now, char="a"),
            _Event("press", now + 0.01, x=150, y=10, button="left"),  # the banner's checkbox
            _Event("release", now + 0.02, x=150, y=10, button="left"),
            _Event("private", now + 0.03, on=True),
            *[_Event("key", now + 0.04 + i / 1000, char=c) for i, c in enumerate("s3cr3t")],
            _Event("scroll", now + 0.05, x=120, y=20, dy=-1),
        ],
    )
    trace.close()
    assert [r["actions"][0] for r in written] == [
        {"action": "type", "text": "a"},
        {"action": "type", "text": "{{PASSWORD}}"},
    ]
    assert recorder.secrets.values == {"PASSWORD": "s3cr3t"}


def test_a_tick_heard_before_the_banner_press_that_made_it_leaves_what_was_typed_before_in_the_open(tmp_path):
    """On a busy machine the pointer's listener thread can stamp the press on the banner's box after the
    banner has already said "private": the text typed before the tick is still written as typed, and only
    what follows is kept out."""
    trace, recorder = _fed_recorder(tmp_path)
    recorder.keep_out([Region(100, 0, 100, 30)])
    now = time.monotonic()
    written = _stamped_events(
        recorder,
        [
            *[_Event("key", now + i / 1000, char=c) for i, c in enumerate("ada@example.org")],
            _Event("private", now + 0.03, on=True),
            _Event("press", now + 0.04, x=150, y=10, button="left"),  # the box's press, stamped late
            _Event("release", now + 0.05, x=150, y=10, button="left"),
            *[_Event("key", now + 0.06 + i / 1000, char=c) for i, c in enumerate("s3cr3t")],
            _Event("scroll", now + 0.08, x=120, y=20, dy=-1),
        ],
    )
    trace.close()
    assert [r["actions"][0] for r in written] == [
        {"action": "type", "text": "ada@example.org"},
        {"action": "type", "text": "{{PASSWORD}}"},
    ]
    assert recorder.secrets.values == {"PASSWORD": "s3cr3t"}
    assert b"s3cr3t" not in (tmp_path / "run" / "trace.jsonl").read_bytes()
