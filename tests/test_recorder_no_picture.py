"""A person step without a picture is still recorded, and says why: the browser refused the picture (the
person is told at the end too), or the recorder heard the step only after the page had moved on, when a
picture would show a page the step never saw. The recorder's own run, headless, trusted input."""

from __future__ import annotations

import time

import pytest

from qvl_agent.act.browser import BrowserExecutor
from qvl_agent.act.recorder import MOVED_ON, PersonCapture
from qvl_agent.trace import TraceWriter
from tests.pages.helpers import CHROMIUM
from tests.pages.server import PageServer

pytestmark = [pytest.mark.browser]

CRASHED = "Protocol error (Page.captureScreenshot): Target crashed"


@pytest.fixture
def recording(tmp_path):
    """(the executor on the login page, its PersonCapture switched on)."""
    server = PageServer().start()
    trace = TraceWriter(tmp_path / "run")
    executor = BrowserExecutor(f"{server.url}/login.html", browser=CHROMIUM, headless=True)
    try:
        capture = PersonCapture(executor, trace)
        capture.start(1)
        executor.page.reload()  # the capture script is in the page from its first script on
        capture.pump(0.3)
        yield executor, capture
    finally:
        executor.close()
        trace.close()
        server.stop()


def _hear(capture, steps: int, seconds: float = 60) -> None:
    """Let the page's events in until step `steps` is the recorder's pending step (its picture taken or
    not): a loaded machine's recorder gets there later than an idle one's, and `stop` writes only a step
    that got there."""
    deadline = time.monotonic() + seconds
    while getattr(capture._pending, "n", 0) < steps and time.monotonic() < deadline:
        capture.pump(0.1)


def _points(executor, *selectors: str) -> list[tuple[float, float]]:
    boxes = [executor.page.locator(selector).bounding_box() for selector in selectors]
    return [(box["x"] + 5, box["y"] + 5) for box in boxes]


def test_a_step_whose_picture_the_browser_refuses_is_recorded_and_the_person_told_why(recording, monkeypatch):
    executor, capture = recording

    def crashed(*args, **kwargs):
        raise executor._error_type(CRASHED)

    monkeypatch.setattr(executor.page, "screenshot", crashed)
    executor.page.mouse.click(*_points(executor, "#username")[0])  # trusted input, as the person's is
    _hear(capture, 1)
    records = capture.stop()
    assert [r["actions"][0]["action"] for r in records] == ["left_click"] and "screenshot" not in records[0]
    assert records[0]["no_screenshot"] == f"the browser did not take it: {CRASHED}"
    assert capture.problems == [f"step 1 has no picture ({CRASHED})"]


def test_a_step_heard_after_the_next_one_has_no_picture_of_a_page_it_never_saw(recording):
    executor, capture = recording
    user, password = _points(executor, "#username", "#password")
    # The second press is sent while the recorder is still asking the page about the first (each of its
    # questions waits behind the test's own input): a busy machine's recorder.
    executor.page.mouse.click(*user)
    executor.page.mouse.click(*password)
    _hear(capture, 2)
    records = capture.stop()
    assert [r["results"][0]["detail"]["locator"]["name"] for r in records] == ["Username", "Password"]
    assert "screenshot" not in records[0] and records[0]["no_screenshot"] == MOVED_ON
    assert records[1]["screenshot"] and capture.problems == []
