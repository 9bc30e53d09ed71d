"""The tray's Playwright script when no editor opens, on a real X display: the script is shown in a window
of ours, inside the screen, with Copy and Save as…, and xdg-open's complaints stay off the terminal. When
an editor does open, no window of ours appears."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from tests.conftest import ROOT

pytestmark = [pytest.mark.display, pytest.mark.slow]

SCRIPT = """# qvl-agent: run with `qvl-agent replay order.py`
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    page = p.chromium.launch().new_page()
    page.goto("https://shop.example/")
    page.get_by_role("button", name="Place order").click()
"""


def hand_over(x_display, tmp_path, opener: str | None) -> tuple[dict, subprocess.CompletedProcess]:
    """Run the hand-off with `opener` as the only xdg-open on PATH (None: there is none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if opener is not None:
        (bin_dir / "xdg-open").write_text(opener)
        (bin_dir / "xdg-open").chmod(0o755)
    script = tmp_path / "order.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = dict(os.environ, DISPLAY=x_display, QT_QPA_PLATFORM="xcb", PYTHONPATH=str(ROOT), PATH=f"{bin_dir}:/bin")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.script_on_display", str(tmp_path), str(script)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done


def inside(inner: list[int], outer: list[int]) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


FAILING = "#!/bin/sh\nfor i in $(seq 20); do echo \"xdg-open: no method available for '$1'\" >&2; done\nexit 3\n"


@pytest.mark.parametrize("opener", [FAILING, None], ids=["xdg-open fails", "no xdg-open"])
def test_without_an_editor_the_script_is_shown_with_copy_and_save_as(x_display, tmp_path, opener):
    report, done = hand_over(x_display, tmp_path, opener)
    window = report["window"]
    assert window is not None, f"no script window appeared; the tray said {report['finished']}"
    assert window["title"] == "qvl-agent: Playwright script"
    assert window["shown_text"] == SCRIPT
    assert any("No editor could be opened" in label and "qvl-agent replay" in label for label in window["labels"])
    assert inside(window["frame"], window["screen"])
    seen = Image.open(tmp_path / "shown.png").convert("RGB")
    for name, words in (("copy_button", "Copy"), ("save_button", "Save as")):
        button = window["buttons"][name]
        assert button["visible"] and words in button["text"].replace("&", ""), button
        assert inside(button["rect"], window["frame"]), (name, button)
        x, y, w, h = button["rect"]
        drawn = {seen.getpixel((px, py)) for px in range(x + 2, x + w - 2) for py in range(y + 2, y + h - 2)}
        assert len(drawn) > 2, f"nothing is drawn where the {name} is"
    x, y, w, h = window["view"]
    text_area = {seen.getpixel((px, py)) for px in range(x + 4, x + w // 2) for py in range(y + 4, y + 40)}
    assert len(text_area) > 2, "the script's text is not drawn"
    assert report["clipboard"] == SCRIPT  # Copy
    copy = tmp_path / "copy.py"  # Save as…
    assert copy.read_text(encoding="utf-8") == SCRIPT and copy.stat().st_mode & 0o777 == 0o600
    assert report["status"] == f"Saved as {copy}."
    assert "xdg-open" not in done.stderr  # its complaints are not dumped on the person's terminal


def test_when_an_editor_opens_no_window_of_ours_appears(x_display, tmp_path):
    opened = tmp_path / "opened.txt"
    report, _ = hand_over(x_display, tmp_path, f'#!/bin/sh\nprintf %s "$1" > {opened}\nexit 0\n')
    assert report["window"] is None
    assert opened.read_text() == str(tmp_path / "order.py")
    assert report["finished"] and "Wrote the Playwright script" in report["finished"][0]
