"""A person step whose picture the browser cannot take is still recorded, and the person is told at the end
which step went without one and why (the recorder's own run, headless, trusted input)."""

from __future__ import annotations

import pytest

from qvl_agent.act.browser import BrowserExecutor
from qvl_agent.act.recorder import PersonCapture
from qvl_agent.trace import TraceWriter
from tests.pages.helpers import CHROMIUM
from tests.pages.server import PageServer

pytestmark = [pytest.mark.browser]

CRASHED = "Protocol error (Page.captureScreenshot): Target crashed"


def test_a_person_step_whose_picture_cannot_be_taken_is_recorded_and_the_person_told_why(tmp_path, monkeypatch):
    server = PageServer().start()
    trace = TraceWriter(tmp_path / "run")
    executor = BrowserExecutor(f"{server.url}/login.html", browser=CHROMIUM, headless=True)
    try:
        capture = PersonCapture(executor, trace)
        capture.start(1)
        executor.page.reload()  # the capture script is in the page from its first script on
        capture.pump(0.3)

        def crashed(*args, **kwargs):
            raise executor._error_type(CRASHED)

        monkeypatch.setattr(executor.page, "screenshot", crashed)
        box = executor.page.locator("#username").bounding_box()
        executor.page.mouse.click(box["x"] + 5, box["y"] + 5)  # trusted input, as the person's is
        capture.pump(1.0)
        records = capture.stop()
    finally:
        executor.close()
        trace.close()
        server.stop()
    assert [r["actions"][0]["action"] for r in records] == ["left_click"] and not records[0].get("screenshot")
    assert capture.problems == [f"step 1 has no picture ({CRASHED})"]
