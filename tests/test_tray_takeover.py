"""Take over and hand back from `qvl-agent tray`, end to end on the virtual display with jwm's tray.

A task runs from "Run a task…" with the replay engine on the test form; the person presses the take-over
hotkey (xdotool), clicks and types in the form, and hands back with the tray menu's "Hand back" (the real
menu, opened by a right click on the icon). The run's trace, the report and what the tray said (its notices
on stderr) show what happened: the person's steps are in the trace with their screenshots, the menu's clicks
and the hotkey are not, the next step was asked with what the person did, and the run ends as the replies say.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from qvl_agent.trace import read_trace
from tests.support.tray import Tray, centre, geometry, wait_gone, wait_window, xdo
from tests.test_desktop_e2e import FormApp, call

pytestmark = [pytest.mark.display, pytest.mark.slow]

TASK = "Fill in the form"
MENU_ITEMS = 7  # Ask about screen, Ask about region, Run a task…, Take over, Open report, Settings, Quit
TAKEOVER_ITEM = 3  # counted from 0


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def runs(data_home: Path) -> list[Path]:
    root = data_home / "qvl-agent" / "runs"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def click(display: str, x: int, y: int, button: str = "1") -> None:
    xdo(display, "mousemove", "--sync", str(x), str(y))
    xdo(display, "click", button)


def menu_item(tray: Tray, index: int) -> tuple[int, int]:
    """Right-click the tray icon; the middle of the menu's item `index` (the items share the menu's height)."""
    click(tray.display, *centre(tray.display, tray.icon()), button="3")
    x, y, w, h = geometry(tray.display, tray.popup_menu())
    return x + w // 2, y + round(h * (index + 0.5) / MENU_ITEMS)


def start_task(tray: Tray, form: FormApp) -> float:
    """Once the model is ready, run TASK from the tray and wait for the agent's first step (the name typed);
    returns when the task was asked for (time.monotonic())."""
    tray.wait_notice("Ready:")
    t0 = time.monotonic()
    assert tray.cli("tray", "--send", "task").returncode == 0
    dialog = wait_window(tray.display, "^qvl-agent: run a task")
    xdo(tray.display, "windowactivate", "--sync", dialog, check=False)
    xdo(tray.display, "type", "--delay", "5", TASK)
    xdo(tray.display, "key", "Return")
    tray.wait_notice(f"Working on “{TASK}”", after=t0)
    form.wait_state(lambda s: s["name"] == "Ada")
    return t0


@pytest.fixture
def form(x_display, tmp_path):
    app = FormApp(tmp_path)
    yield app
    app.close()


def test_the_person_takes_a_tray_task_over_with_the_hotkey_and_hands_it_back_from_the_menu(x_display, form, tmp_path):
    replies = [
        call(action="left_click", coordinate=form.center("name")) + call(action="type", text="Ada"),
        call(action="wait", time=3),  # the take-over begins after this step or the one before
        "The form is filled.\n" + call(action="terminate", status="success"),
    ]
    data_home = tmp_path / "data"
    tray = Tray(x_display, tmp_path, replies, env={"QVL_SAFETY_MODE": "auto", "XDG_DATA_HOME": str(data_home)})
    try:
        t0 = start_task(tray, form)

        xdo(tray.display, "key", "ctrl+alt+t")
        paused = tray.wait_notice("you have control", after=t0)
        assert "choose Hand back in the menu" in paused, paused
        x, y, w, h = form.widgets["email"]
        click(tray.display, x + w // 2, y + h // 2)
        xdo(tray.display, "type", "--delay", "30", "ada@example.org")
        form.wait_state(lambda s: s["email"] == "ada@example.org")

        handing = time.monotonic()
        click(tray.display, *menu_item(tray, TAKEOVER_ITEM))
        tray.wait_notice("Handed back: the agent goes on.", after=handing)
        tray.wait_notice("Task done: The model ended the task: success.", after=t0, timeout=60)
        wait_gone(tray.display, "^qvl-agent marker$")
        tray.quit()
    finally:
        tray.stop()

    (run,) = runs(data_home)
    trace = read_trace(run)
    steps = trace.steps
    by = [s.get("by", "agent") for s in steps]
    person = [s for s in steps if s.get("by") == "person"]
    assert [s["actions"][0] for s in person] == [
        {"action": "left_click", "coordinate": person[0]["actions"][0]["coordinate"]},
        {"action": "type", "text": "ada@example.org"},
    ], person  # neither the hotkey nor the tray menu's clicks are the person's steps
    first = by.index("person")
    assert by == ["agent"] * first + ["person", "person"] + ["agent"] * (len(by) - first - 2), by
    assert first in (1, 2), by  # after the agent's first step or its second
    assert [s["step"] for s in person] == [first + 1, first + 2]
    assert all(s.get("screenshot") and (run / s["screenshot"]).is_file() for s in person)

    told = steps[first + 2]["observation"]
    assert "The person took over and: clicked at" in told and "typed 'ada@example.org'" in told, told
    assert told.rstrip().endswith("They handed the run back to you."), told
    assert steps[-1]["actions"][0]["action"] == "terminate"
    assert trace.end["status"] == "success"
    assert form.state()["email"] == "ada@example.org"

    report = (run / "report.html").read_text()
    assert report.count(">by the person<") == 2 and ">by the agent<" in report


def test_where_no_hotkey_works_send_takes_over_hands_back_and_stops(x_display, form, tmp_path):
    """`tray --send takeover` and `tray --send stop`, what a desktop shortcut runs under Wayland: the run pauses
    for the person, goes on when handed back, and stops before the model's later step ever happens."""
    replies = [
        call(action="left_click", coordinate=form.center("name")) + call(action="type", text="Ada"),
        call(action="wait", time=3),  # the take-over begins after this step or the one before
        call(action="wait", time=30),  # the stop comes during this one
        call(action="left_click", coordinate=form.center("email")) + call(action="type", text="never"),
        call(action="terminate", status="success"),
    ]
    data_home = tmp_path / "data"
    tray = Tray(x_display, tmp_path, replies, env={"QVL_SAFETY_MODE": "auto", "XDG_DATA_HOME": str(data_home)})
    try:
        t0 = start_task(tray, form)

        assert tray.cli("tray", "--send", "takeover").returncode == 0
        tray.wait_notice("you have control", after=t0)
        handing = time.monotonic()
        assert tray.cli("tray", "--send", "takeover").returncode == 0
        tray.wait_notice("Handed back: the agent goes on.", after=handing)
        wait_for(lambda: len(read_trace(runs(data_home)[0]).steps) >= 2, "the step that waits 3 s")
        assert tray.cli("tray", "--send", "stop").returncode == 0
        stopped = tray.wait_notice("Task stopped", after=t0, timeout=20)
        assert "tray --send stop" in stopped, stopped
        tray.quit()
    finally:
        tray.stop()

    (run,) = runs(data_home)
    trace = read_trace(run)
    assert trace.end["status"] == "stopped"
    assert form.state()["email"] == ""  # the model's later step never happened
    assert not any(s.get("by") == "person" for s in trace.steps)  # the person held the run and did nothing
