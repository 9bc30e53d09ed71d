"""The run report and `trace list/show/report`: a real dry run on the virtual display, its report opened in
real Chromium, every step's picture and marker checked, and a hostile reply that must not run."""

from __future__ import annotations

import json
import time

import pytest

from qvl_agent.scripts.export.exporter import SCRIPT_CHROMIUM_ARGS
from qvl_agent.trace import TraceWriter, default_trace_dir, latest_run, run_dirs
from tests.conftest import run_cli
from tests.pages.helpers import CHROMIUM, call

HOSTILE = (
    "<script>document.title='pwned'; window.pwned = 1</script>"
    "<img src=x onerror=\"document.title='pwned-img'\"> I will click </pre><b>now</b>"
)


@pytest.fixture
def data_home(tmp_path):
    """Runs go to a private data folder (platformdirs follows XDG_DATA_HOME)."""
    home = tmp_path / "data"
    return home, {"XDG_DATA_HOME": str(home)}


def _dry_run(env, task: str, replies: list[str], tmp_path, code: int = 3) -> str:
    replay = tmp_path / f"replay-{len(replies)}.json"
    replay.write_text(json.dumps(replies), encoding="utf-8")
    done = run_cli("run", "--engine", f"replay:{replay}", "--dry-run", task, env=env, timeout=120)
    assert done.returncode == code, done.stderr
    return done.stderr


REPLIES = [
    call(action="left_click", coordinate=[500, 500]),
    call(action="left_click_drag", start_coordinate=[100, 100], coordinate=[300, 300]),
    call(action="scroll", pixels=-300, coordinate=[500, 600]),
    HOSTILE,  # not a tool call: a parse error fed back to the model, a failed step
    call(action="left_click", coordinate=[1500, 500]),  # off the screen: refused by the guard
    call(action="terminate", status="success"),
]


@pytest.mark.display
@pytest.mark.browser
def test_report_shows_every_step_with_its_markers_and_runs_no_script(x_display, data_home, tmp_path):
    home, env = data_home
    stderr = _dry_run(env, "Tidy <the> desktop", REPLIES, tmp_path)
    run_dir = latest_run(home / "qvl-agent" / "runs")
    assert f"report: {run_dir / 'report.html'}" in stderr  # `run` writes the report and says where

    # `trace report` with no folder takes the latest run and prints the path
    (run_dir / "report.html").unlink()
    made = run_cli("trace", "report", env=env)
    assert made.returncode == 0, made.stderr
    report = run_dir / "report.html"
    assert made.stdout.strip() == str(report) and report.is_file()
    raw = [p.read_bytes() for p in sorted(run_dir.glob("step-*.png"))]
    assert len(raw) == 6

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=SCRIPT_CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(report.as_uri())
        page.wait_for_load_state("load")
        steps = page.locator("section.step")
        assert steps.count() == 6
        for i in range(6):
            img = steps.nth(i).locator(".shot img")
            assert img.evaluate("im => im.complete && im.naturalWidth > 0"), f"step {i + 1} image did not load"
        thumbs = page.locator("nav.timeline .thumb img")
        assert thumbs.count() == 6
        assert all(thumbs.nth(i).evaluate("im => im.naturalWidth > 0") for i in range(6))

        # each marker sits where the action landed, drawn over the picture (not into the PNGs)
        click = page.locator('#step-1 g.marker[data-action="left_click"]')
        assert (click.get_attribute("data-x"), click.get_attribute("data-y")) == ("960", "540")
        shot_box = page.locator("#step-1 .shot img").bounding_box()
        ring = click.locator("circle").first.bounding_box()
        centre = (ring["x"] + ring["width"] / 2 - shot_box["x"], ring["y"] + ring["height"] / 2 - shot_box["y"])
        assert abs(centre[0] / shot_box["width"] - 0.5) < 0.01 and abs(centre[1] / shot_box["height"] - 0.5) < 0.01
        drag = page.locator('#step-2 g.marker[data-action="left_click_drag"]')
        assert drag.count() == 1 and drag.locator("line").get_attribute("x1") == "192.0"
        assert page.locator('#step-3 g.marker[data-action="scroll"]').count() == 1

        # failures stand out; the hostile reply is shown as text and did not run
        failed = [steps.nth(i).get_attribute("class") for i in range(6)]
        assert ["failed" in c for c in failed] == [False, False, False, True, True, False]
        assert page.locator(".thumb.failed").count() == 2
        assert page.locator("#step-5 .guard").inner_text().startswith("refused")
        assert page.locator("#step-4 pre.reply").inner_text() == HOSTILE
        assert page.title() != "pwned" and "pwned" not in page.title()
        assert page.evaluate("() => window.pwned") is None
        assert page.locator("#step-4 pre.reply b").count() == 0 and page.locator("script").count() == 0
        timings = page.locator("#step-1 .timings").inner_text()
        assert "capture" in timings and "model" in timings and "act" in timings
        assert "Tidy <the> desktop" in page.locator("header").inner_text()
        browser.close()

    assert [p.read_bytes() for p in sorted(run_dir.glob("step-*.png"))] == raw  # PNGs untouched


@pytest.mark.display
def test_trace_list_shows_runs_newest_first_and_show_takes_the_latest(x_display, data_home, tmp_path):
    home, env = data_home
    assert run_cli("trace", "list", env=env).stdout.startswith("No runs in")
    nothing = run_cli("trace", "show", env=env)
    assert nothing.returncode == 2 and "no runs" in nothing.stderr.lower()

    _dry_run(env, "First task", [call(action="terminate", status="success")], tmp_path)
    second = [call(action="left_click", coordinate=[10, 10]), call(action="terminate", status="failure")]
    _dry_run(env, "Second task", second, tmp_path, code=1)
    listed = run_cli("trace", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "Second task" in lines[0] and "2 steps" in lines[0] and "failure" in lines[0]
    assert "First task" in lines[1] and "1 steps" in lines[1] and "dry_run" in lines[1]
    shown = run_cli("trace", "show", env=env)
    assert shown.returncode == 0 and "Second task" in shown.stdout


@pytest.mark.display
def test_trace_report_open_hands_the_report_to_the_web_browser(x_display, data_home, tmp_path):
    home, env = data_home
    _dry_run(env, "Open it", [call(action="terminate", status="success")], tmp_path)
    opened = tmp_path / "opened.txt"
    opener = tmp_path / "opener.sh"
    opener.write_text(f'#!/bin/sh\nprintf %s "$1" > {opened}\n')
    opener.chmod(0o755)
    made = run_cli("trace", "report", "--open", env=dict(env, BROWSER=f"{opener} %s"))
    assert made.returncode == 0, made.stderr
    report = latest_run(home / "qvl-agent" / "runs") / "report.html"
    deadline = time.monotonic() + 10
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert opened.read_text() == report.as_uri()


def test_run_folders_never_collide_and_sort_newest_first(tmp_path):
    """One process (the MCP server, the tray) may start several runs within a second."""
    made = []
    for _ in range(12):
        d = default_trace_dir(tmp_path)
        TraceWriter(d).close()
        made.append(d)
    assert len(set(made)) == 12
    assert run_dirs(tmp_path) == list(reversed(made))
    assert latest_run(tmp_path) == made[-1]


def test_a_crashed_run_on_a_second_monitor_still_gets_a_report(tmp_path):
    """Markers sit in the screenshot's own pixels (the monitor's offset taken off); a lost PNG and a run
    that never ended are said plainly, not fatal."""
    from qvl_agent.image import Screenshot
    from qvl_agent.report import write_report

    shot = Screenshot(bytes(64 * 48 * 4), 64, 48, "BGRA", left=1920, top=0)
    writer = TraceWriter(tmp_path / "run")
    writer.start(task="Crash <b>here</b>", engine="replay", executor="desktop", mode="auto")
    for step in (1, 2):
        writer.step(
            {
                "step": step,
                "screenshot": writer.screenshot(step, shot),
                "screen": {"left": 1920, "top": 0, "width": 64, "height": 48, "scale": 1.0},
                "reply": "click",
                "actions": [{"action": "left_click", "coordinate": [500, 500]}],
                "results": [{"action": "left_click at (500, 500)", "ok": True, "message": "", "pixels": [[1952, 24]]}],
                "timings": {"capture_ms": 1.0, "model_ms": 2.0, "act_ms": 3.0},
            }
        )
    writer.close()  # no end record: the process died
    (tmp_path / "run" / "step-002.png").unlink()
    page = write_report(tmp_path / "run").read_text(encoding="utf-8")
    assert 'data-action="left_click" data-x="32" data-y="24"' in page
    assert page.count("<section") == 2 and "screenshot step-002.png is missing" in page
    assert "did not finish" in page and '<header class="bad">' in page
    assert "Crash &lt;b&gt;here&lt;/b&gt;" in page and "<b>here</b>" not in page


def test_a_person_step_without_a_picture_shows_why(tmp_path):
    from qvl_agent.report import write_report

    writer = TraceWriter(tmp_path / "run")
    writer.start(task="Sign in", engine="replay", executor="browser", mode="auto")
    writer.step(
        {
            "step": 1,
            "by": "person",
            "no_screenshot": "the browser did not take it: <Target crashed>",
            "actions": [{"action": "left_click"}],
            "results": [{"action": 'click the "User" textbox', "ok": True, "message": "done by the person"}],
        }
    )
    writer.close()
    page = write_report(tmp_path / "run").read_text(encoding="utf-8")
    assert "no screenshot: the browser did not take it: &lt;Target crashed&gt;" in page
    assert "is missing" not in page


def test_trace_show_and_list_escape_the_models_control_characters(tmp_path):
    """A reply or task holding terminal escape sequences (clear screen, set the window title, bidi
    overrides) reaches the terminal as visible escapes, never as the bytes themselves."""
    runs = tmp_path / "data" / "qvl-agent" / "runs"
    writer = TraceWriter(runs / "20260101-000000-1")
    writer.start(task="tidy \x1b]0;OWNED\x07 up", engine="replay", executor="dry-run", mode="dry-run")
    reply = "sure\x1b[2J\r\x1b[31mdone\u202e\nsecond line"
    writer.step({"step": 1, "reply": reply, "results": [{"action": "wait", "ok": False, "message": "no\x1b[5m"}]})
    writer.end(status="failure", steps=1, message="gave up\x08\x08", answer="bye\x1b[?1049h")
    writer.close()
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    for args in (("trace", "show"), ("trace", "list")):
        shown = run_cli(*args, env=env)
        assert shown.returncode == 0, shown.stderr
        assert not any(c in shown.stdout for c in "\x1b\x07\x08\r\u202e"), repr(shown.stdout)
        assert "tidy \\x1b]0;OWNED\\x07 up" in shown.stdout
    shown = run_cli("trace", "show", env=env).stdout
    assert "sure\\x1b[2J" in shown and "\\x1b[31mdone\\u202e" in shown and "second line" in shown


def test_trace_records_of_another_shape_are_skipped_as_damaged_not_fatal(tmp_path):
    """Lines that are valid JSON but not what qvl-agent writes (a trace edited by hand, or by another tool)
    are counted as damaged; `trace show`, `trace list` and `trace report` still work, with one note."""
    runs = tmp_path / "data" / "qvl-agent" / "runs"
    writer = TraceWriter(runs / "20260101-000000-1")
    writer.start(task=["not", "text"], engine="replay", executor="dry-run", mode="dry-run", started=[2026])
    good = {"step": 1, "reply": "fine", "results": [{"action": "wait", "ok": True, "message": "waited"}]}
    writer.step(good)
    for bad in (
        {"step": "2"},
        {"step": 3, "results": [1, 2]},
        {"step": 4, "reply": None},
        {"step": 5, "timings": {"model_ms": [1]}},
        {"step": 6, "screen": {"width": "wide"}},
        {"step": 7, "results": [{"action": "left_click", "ok": True, "pixels": [[1, 2, 3]]}]},
        {"step": 8, "actions": [{"action": "scroll", "pixels": [3]}], "results": [{"action": "scroll"}]},
    ):
        writer.step(bad)
    writer.end(status={"odd": 1}, steps=8, message="done")
    writer.close()
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    shown = run_cli("trace", "show", env=env)
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    assert "step 1" in shown.stdout and "fine" in shown.stdout and "step 2" not in shown.stdout
    assert "7 damaged line(s) skipped" in shown.stdout
    listed = run_cli("trace", "list", env=env)
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    assert "20260101-000000-1" in listed.stdout and "1 steps" in listed.stdout
    made = run_cli("trace", "report", env=env)
    assert made.returncode == 0 and not made.stderr, made.stderr
    assert (runs / "20260101-000000-1" / "report.html").read_text(encoding="utf-8").count("<section") == 1
