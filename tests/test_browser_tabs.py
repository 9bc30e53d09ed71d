"""A tab that closes itself under the agent's click (a survey, a sign-in popup): the click happened and
the run goes on in the tab left open; only a browser that is really gone ends the run."""

from __future__ import annotations

import pytest

from qvl_agent import actions as A
from qvl_agent.act.browser import BrowserExecutor
from qvl_agent.errors import BrowserError
from tests.pages.helpers import CHROMIUM
from tests.pages.server import PageServer

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()  # closing-start.html opens closing-popup.html, which closes itself
    yield srv
    srv.stop()


def wait_for_page(executor: BrowserExecutor, url: str) -> None:
    for _ in range(100):
        if executor.page.url == url:
            return
        executor.page.wait_for_timeout(100)  # lets Playwright deliver the tab's events
    assert executor.page.url == url


@pytest.mark.parametrize("when", ["mousedown", "mouseup", "click"])
def test_a_tab_that_closes_itself_under_a_click_leaves_the_run_in_the_tab_left_open(server, when):
    start = f"{server.url}/closing-start.html?when={when}"
    executor = BrowserExecutor(start, browser=CHROMIUM, headless=True)
    try:
        opened = executor.execute(A.LeftClick(500, 500), executor.observe())
        assert opened.ok
        wait_for_page(executor, f"{server.url}/closing-popup.html?when={when}")  # the run follows the new tab
        sent = executor.execute(A.LeftClick(500, 500), executor.observe())
        assert sent.ok, sent.message
        wait_for_page(executor, start)
        assert executor.page.title() == f"sent on {when}"  # the click reached the popup's button
        assert executor.observe().width > 0  # the run goes on
    finally:
        executor.close()


def test_a_browser_that_is_really_gone_still_ends_the_run(server):
    executor = BrowserExecutor(f"{server.url}/closing-start.html", browser=CHROMIUM, headless=True)
    try:
        shot = executor.observe()
        executor.browser.close()
        with pytest.raises(BrowserError, match="closed"):
            executor.execute(A.LeftClick(500, 500), shot)
    finally:
        executor.close()


def test_a_click_answered_with_target_closed_as_its_tab_closes_is_still_done(server, monkeypatch):
    """On a busy machine Playwright can answer the click itself with "Target page, context or browser has
    been closed" when the tab closes before the click's last event came back. That race cannot be made to
    happen on demand, so the real click is followed by Playwright's own error for it."""
    from playwright.sync_api import Error as PlaywrightError

    start = f"{server.url}/closing-start.html?when=click"
    executor = BrowserExecutor(start, browser=CHROMIUM, headless=True)
    try:
        executor.execute(A.LeftClick(500, 500), executor.observe())
        wait_for_page(executor, f"{server.url}/closing-popup.html?when=click")
        popup, mouse = executor.page, executor.page.mouse
        click = mouse.click

        def click_then_closed(*args, **kwargs):
            click(*args, **kwargs)
            popup.wait_for_event("close", timeout=10_000)
            raise PlaywrightError("Target page, context or browser has been closed")

        monkeypatch.setattr(mouse, "click", click_then_closed)
        sent = executor.execute(A.LeftClick(500, 500), executor.observe())
        assert sent.ok and sent.message.startswith("done")
        assert executor.page.url == start and executor.page.title() == "sent on click"
        assert executor.observe().width > 0
    finally:
        executor.close()
