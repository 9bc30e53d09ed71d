"""The tray's confirm dialog on a real X display, as a person sees it: the model's reason and the action in
words (never the model's 0-1000 coordinates), Yes, No and Stop inside the window, and the red ring on the
spot beside the dialog, not under it. No tells the model and the run goes on; Stop ends the run before
anything is done. The terminal asks with the same words. A dry run started with Do it comes back to the
window saying nothing was done, with every action it would have run on the screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from tests.conftest import ROOT
from tests.pages.helpers import call

pytestmark = [pytest.mark.display, pytest.mark.slow]

MARKER_RED = (230, 30, 30)
REASON = "Thought: the Place order button finishes the order, so I click it."


def confirm_on_display(x_display, tmp_path, replies: list[str], *answers: str) -> dict:
    (tmp_path / "replies.json").write_text(json.dumps(replies), encoding="utf-8")
    env = dict(os.environ, DISPLAY=x_display, QT_QPA_PLATFORM="xcb", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.confirm_on_display", str(tmp_path), str(tmp_path / "replies.json"),
         *answers],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def inside(inner: list[int], outer: list[int]) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def test_the_dialog_gives_the_reason_and_the_action_in_words_with_stop_beside_yes_and_no(x_display, tmp_path):
    replies = [
        REASON + "\n" + call(action="left_click", coordinate=[500, 500]),
        call(action="terminate", status="success"),
    ]
    report = confirm_on_display(x_display, tmp_path, replies, "stop")
    [asked] = report["asked"]
    width, height = asked["screen"][2:]
    spot = (width // 2, height // 2)  # 500/1000 of the screen
    assert asked["title"] == "qvl-agent: allow this action?"
    texts = "\n".join(asked["texts"])
    assert REASON in texts
    assert f"It will click at pixel ({spot[0]}, {spot[1]})." in texts
    assert "left_click" not in texts and "(500, 500)" not in texts  # no model coordinates, no tool names

    seen = Image.open(tmp_path / "ask-1.png").convert("RGB")
    assert seen.size == (width, height)
    assert inside(asked["frame"], asked["screen"]), asked
    for name, words in (("yes", "Yes"), ("no", "No"), ("stop", "Stop")):
        button = asked["buttons"][name]
        assert button["visible"] and words in button["text"].replace("&", ""), button
        assert inside(button["rect"], asked["frame"]), (name, button, asked["frame"])
        x, y, w, h = button["rect"]
        drawn = {seen.getpixel((px, py)) for px in range(x + 2, x + w - 2) for py in range(y + 2, y + h - 2)}
        assert len(drawn) > 2, f"nothing is drawn where the {name} button is"  # its label and face, on screen
    # The ring is on the spot while the person decides, and the dialog does not cover it.
    assert asked["marker"] is not None
    x, y = spot
    ring = {seen.getpixel((x + dx, y + dy)) for dx in range(-40, 41) for dy in range(-40, 41)}
    assert MARKER_RED in ring
    fx, fy, fw, fh = asked["frame"]
    assert not (fx <= x < fx + fw and fy <= y < fy + fh), "the dialog covers the marked spot"

    assert report["executed"] == []  # Stop: nothing was done
    assert report["finished"] == f"Task cancelled: you stopped the run before it would click at pixel ({x}, {y})."


def test_no_tells_the_model_and_the_run_goes_on(x_display, tmp_path):
    replies = [
        REASON + "\n" + call(action="left_click", coordinate=[500, 500]),
        "The person does not want that; I type instead.\n" + call(action="type", text="hello"),
        call(action="terminate", status="success"),
    ]
    report = confirm_on_display(x_display, tmp_path, replies, "no", "yes")
    first, second = report["asked"]
    assert (
        "It will type 'hello'." in second["texts"]
        and "The person does not want that; I type instead." in (second["texts"])
    )
    assert second["marker"] is None  # typing has no spot to mark
    assert report["executed"] == ["type"]
    assert report["finished"] == "Task done: The model ended the task: success."
    runs = list((tmp_path / "runs").iterdir())
    trace = [json.loads(line) for line in (runs[0] / "trace.jsonl").read_text().splitlines()]
    assert "The person declined left_click" in trace[2]["observation"]  # the model was told


def test_a_dry_run_from_do_it_shows_in_the_window_that_nothing_was_done_and_what_it_would_have_run(x_display, tmp_path):
    replies = [
        call(action="left_click", coordinate=[500, 500]) + call(action="type", text="hello"),
        call(action="terminate", status="success"),
    ]
    report = confirm_on_display(x_display, tmp_path, replies, "--mode=dry-run")
    assert report["asked"] == [] and report["executed"] == []  # nothing asked, nothing done
    window = report["window"]
    assert window["visible"]
    lines = window["status"].splitlines()
    assert lines[0] == "Dry run finished, nothing was clicked or typed: The model ended the task: success."
    assert lines[1:] == ["Would have run (2 actions):", "  1. left_click at (500, 500) -> pixel (960, 540)",
                         "  2. type 'hello'"]  # fmt: skip
    assert window["status"] == report["finished"]
    # The whole list is on the screen, inside the window.
    assert inside(window["status_rect"], window["frame"]), window
    seen = Image.open(tmp_path / "after.png").convert("RGB")
    x, y, w, h = window["status_rect"]
    rows = [y + round(h * (i + 0.5) / 4) for i in range(4)]  # four lines of text, top to bottom
    for row in rows:
        band = {seen.getpixel((px, py)) for px in range(x, x + w // 2) for py in range(row - 4, row + 5)}
        assert len(band) > 2, f"no text drawn at y={row} of the status line {window['status_rect']}"
