"""A page screenshot on a busy machine: Chromium that paints no frame within the timeout (Playwright's own
TimeoutError) gets one more try, and the run goes on; a second timeout, or any other error, ends the step
with one sentence. The first timeout cannot be had on demand, so Playwright's own error stands in for it
before the real screenshot."""

from __future__ import annotations

import pytest

from qvl_agent.act.browser import BrowserExecutor
from qvl_agent.errors import ActionError
from tests.pages.helpers import CHROMIUM
from tests.pages.server import PageServer

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def executor():
    server = PageServer().start()
    ex = BrowserExecutor(f"{server.url}/login.html", browser=CHROMIUM, headless=True)
    yield ex
    ex.close()
    server.stop()


UNPAINTED = "Protocol error (Page.captureScreenshot): Unable to capture screenshot"
SWAPPED = "Protocol error (Page.captureScreenshot): Not attached to an active page"


def _late(executor, monkeypatch, times: int, error: str = "") -> list[int]:
    """The page's screenshot times out (or fails with Chromium's `error`) `times` times, then is taken; the
    calls made, counted."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page, calls = executor.page, []
    screenshot = page.screenshot

    def late(*args, **kwargs):
        calls.append(1)
        if len(calls) <= times:
            if error:
                raise PlaywrightError(error)
            raise PlaywrightTimeout("Timeout 10000ms exceeded.")
        return screenshot(*args, **kwargs)

    monkeypatch.setattr(page, "screenshot", late)
    return calls


def test_a_screenshot_that_timed_out_once_is_taken_again_and_the_run_goes_on(executor, monkeypatch):
    calls = _late(executor, monkeypatch, times=1)
    shot = executor.observe()
    assert len(calls) == 2 and (shot.width, shot.height) == executor.viewport


def test_a_screenshot_that_times_out_twice_ends_the_step_in_one_sentence(executor, monkeypatch):
    calls = _late(executor, monkeypatch, times=2)
    with pytest.raises(ActionError, match=r"^The browser could not do that: Timeout 10000ms exceeded\.$"):
        executor.observe()
    assert len(calls) == 2
    monkeypatch.undo()
    assert executor.observe().width == executor.viewport[0]  # the browser itself is fine


def test_a_screenshot_taken_as_a_form_post_swaps_the_document_is_taken_again(executor, monkeypatch):
    """Submitting a form swaps the page's document (and Chromium may swap its renderer): a capture at that
    moment is "Not attached to an active page". The second try waits for the new document."""
    calls = _late(executor, monkeypatch, times=1, error=SWAPPED)
    assert executor.observe().width == executor.viewport[0] and len(calls) == 2


def test_a_screenshot_error_that_is_not_the_moments_is_not_tried_again(executor, monkeypatch):
    calls = _late(executor, monkeypatch, times=1, error="Protocol error (Page.captureScreenshot): Target crashed")
    with pytest.raises(ActionError, match=r"Target crashed"):
        executor.observe()
    assert len(calls) == 1


@pytest.mark.parametrize("error", ["", UNPAINTED, SWAPPED])
def test_a_person_steps_picture_gets_the_same_second_try(executor, monkeypatch, error):
    """The recorder takes a person step's picture through `png` too (no animations disabled: the page is
    the person's), so a busy machine's first failure leaves no step without its picture."""
    calls = _late(executor, monkeypatch, times=1, error=error)
    png = executor.png(executor.page, timeout=10_000)
    assert len(calls) == 2 and png.startswith(b"\x89PNG")
