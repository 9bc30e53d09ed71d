"""The person's actions happen in their order while the recorder is slow: a click the capture script
holds back until its step is recorded happens at the latest at the person's next press, before that press
moves the focus. Headless Chromium, the real capture script, trusted input; the recorder's binding is a
stand-in that answers only when the test lets it (a recorder slowed by a loaded machine)."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from qvl_agent.playwright.recording import BINDING, capture_script
from tests.pages.helpers import CHROMIUM
from tests.pages.server import PageServer

pytestmark = pytest.mark.browser

# Reports are heard and never answered until the test calls `window.__answer()`.
SLOW_RECORDER = f"""window[{BINDING!r}] = () => new Promise((answer) => {{
  const before = window.__answer;
  window.__answer = () => {{ if (before) before(); answer(); }};
}});"""


@pytest.fixture
def form_page():
    srv = PageServer().start()
    srv.site = "a"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        page.add_init_script(SLOW_RECORDER)
        page.add_init_script(capture_script("5eed" * 8))
        page.goto(f"{srv.url}/site/rec-form.html")
        yield page
        browser.close()
    srv.stop()


def _press(page, selector: str, dx: float = 10) -> None:
    box = page.locator(selector).bounding_box()
    page.mouse.click(box["x"] + dx, box["y"] + box["height"] / 2)


def test_a_held_click_on_a_label_happens_before_the_next_press_and_what_is_typed_lands_there(form_page):
    page = form_page
    _press(page, "label:has(#news)", dx=60)  # the label's text: its click waits for the slow recorder
    assert page.evaluate("document.getElementById('news').checked") is False  # held, as it should be
    _press(page, "#pw")  # the person goes on before the recorder answered
    page.wait_for_function("document.getElementById('news').checked")  # the held click happened...
    page.keyboard.type("s3cret")
    # ...before the press on the password field, so the focus stayed there and the typing landed in it
    assert page.evaluate("[document.activeElement.id, document.getElementById('pw').value]") == ["pw", "s3cret"]
    page.evaluate("window.__answer()")  # the recorder catches up: nothing happens twice
    page.wait_for_timeout(300)
    assert page.evaluate("document.getElementById('news').checked") is True


def test_a_held_click_happens_before_a_key_the_person_presses_next(form_page):
    page = form_page
    _press(page, "label:has(#news)", dx=60)
    page.keyboard.press("Tab")  # a key, not a press: the held click still comes first
    page.wait_for_function("document.getElementById('news').checked")
    assert page.evaluate("document.activeElement.id") == "pw"  # Tab went on from the box the label focused
