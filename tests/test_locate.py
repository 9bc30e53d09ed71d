"""Element resolution on a real page in real Chromium: each click point resolves to the most robust
locator that matches exactly one element, and that element is the one under the point."""

from __future__ import annotations

import pytest

from qvl_agent.playwright.locate import element_state, focused, locate, point_on, to_playwright
from tests.pages.helpers import CHROMIUM
from tests.pages.server import PageServer

pytestmark = [
    pytest.mark.browser,
]


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    server = PageServer().start()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        pg.goto(server.url + "/locators.html")
        yield pg
        browser.close()
    server.stop()


def centre(page, selector: str, dx: float = 0.5) -> tuple[float, float]:
    box = page.locator(selector).bounding_box()
    return box["x"] + box["width"] * dx, box["y"] + box["height"] / 2


CASES = [
    # selector clicked, expected locator (the first that is unique), what it is
    (
        "#save b",
        {"kind": "role", "role": "button", "name": "Save draft"},
        "button, inner <b>",
    ),
    (
        "#docs i",
        {"kind": "role", "role": "link", "name": "Read the docs"},
        "link, inner <i>",
    ),
    ("#email", {"kind": "role", "role": "textbox", "name": "Email"}, "an input with <label for>"),
    ("#phone", {"kind": "role", "role": "textbox", "name": "Phone"}, "an input inside its label"),
    ("#search", {"kind": "role", "role": "textbox", "name": "Search the shop"}, "an input with aria-label"),
    ("#coupon", {"kind": "role", "role": "textbox", "name": "Coupon code"}, "an input with a placeholder"),
    ("#menu span", {"kind": "role", "role": "button", "name": "Open menu"}, "a div with role=button"),
    ("#more", {"kind": "text", "text": "Show more"}, "a clickable span without a role"),
    ("#close", {"kind": "testid", "value": "close-x"}, "an icon button without a name"),
    ("#summary", {"kind": "text", "text": "Details"}, "a summary"),
]


@pytest.mark.parametrize("selector, expected, what", CASES, ids=[c[2] for c in CASES])
def test_points_resolve_to_exactly_one_robust_locator(page, selector, expected, what):
    x, y = centre(page, selector)
    found = locate(page, x, y)
    assert found.locator == expected, what
    loc = to_playwright(page, found.locator)
    assert loc.count() == 1
    target = page.locator(selector).element_handle()
    assert loc.evaluate(
        "(el, t) => el === t || el.contains(t) || (t.labels && Array.from(t.labels).includes(el))", target
    )


def test_the_label_text_resolves_to_the_control_it_labels(page):
    x, y = centre(page, "label[for=email]")
    assert locate(page, x, y).locator == {"kind": "role", "role": "textbox", "name": "Email"}


def test_duplicate_names_fall_back_to_a_unique_css_path(page):
    second = page.locator("button", has_text="Delete").nth(1)
    box = second.bounding_box()
    found = locate(page, box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert found.locator["kind"] == "css"
    loc = to_playwright(page, found.locator)
    assert loc.count() == 1
    assert loc.evaluate("(el, t) => el === t", second.element_handle())


def test_a_canvas_or_the_bare_page_is_kept_as_coordinates(page):
    x, y = centre(page, "#chart", dx=0.25)
    found = locate(page, x, y)
    # A point inside a canvas means that spot; the canvas's own locator would replay at its centre.
    assert found.locator == {"kind": "point", "x": round(x), "y": round(y)}
    assert locate(page, 1200, 780).locator == {"kind": "point", "x": 1200, "y": 780}


def test_the_focused_field_is_resolved_for_typing(page):
    page.click("#coupon")
    assert focused(page).locator == {"kind": "role", "role": "textbox", "name": "Coupon code"}
    page.evaluate("() => document.activeElement.blur()")
    assert focused(page) is None


@pytest.fixture(scope="module")
def recorder(page):
    """A page opened the way the browser executor opens it: key listeners counted from the start."""
    from qvl_agent.playwright.locate import KEY_LISTENERS_JS

    server = PageServer().start()
    context = page.context.browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(KEY_LISTENERS_JS)
    yield server, context.new_page()
    context.close()
    server.stop()


def test_the_recorded_state_says_whether_the_page_listens_to_keys(recorder):
    server, page = recorder
    page.goto(server.url + "/pin.html")
    assert element_state(page.locator("#pin").element_handle())["keys"] is True
    page.goto(server.url + "/clipboard.html")
    assert "keys" not in element_state(page.locator("#lookup").element_handle())
    page.evaluate("() => { document.onkeydown = () => {}; }")  # a page-wide shortcut handler counts too
    assert element_state(page.locator("#lookup").element_handle())["keys"] is True


def test_the_recorded_state_of_a_multi_select_and_an_editor(recorder):
    server, page = recorder
    page.goto(server.url + "/toppings.html")
    page.locator("#toppings").select_option(["olives", "ham"])
    state = element_state(page.locator("#toppings").element_handle())
    assert state["multiple"] and state["values"] == ["ham", "olives"] and state["labels"] == ["Ham", "Olives"]
    page.goto(server.url + "/notes.html")
    page.locator("#editor").fill("Buy oat milk")
    state = element_state(page.locator("#editor").element_handle())
    assert state["editable"] and state["value"] == "Buy oat milk"


def test_the_point_inside_an_element_replays_where_the_run_acted(recorder):
    server, page = recorder
    page.goto(server.url + "/words.html")
    fig = page.evaluate(
        "() => { const n = document.querySelector('#words').firstChild; const i = n.data.indexOf('fig');"
        " const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 3);"
        " const b = r.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; }"
    )
    words = page.locator("#words")
    found = point_on(words.element_handle(), *fig)
    assert found["centre_hits_other"] is False  # the same paragraph: only the offset tells the word
    x, y = found["offset"]
    words.dblclick(position={"x": x, "y": y})  # what the export writes: the run's word, not the centre's
    assert page.evaluate("() => window.getSelection().toString().trim()") == "fig"
    words.dblclick()
    assert page.evaluate("() => window.getSelection().toString().trim()") != "fig"


def test_a_click_through_a_label_does_not_count_as_hitting_another_target(recorder):
    server, page = recorder
    page.goto(server.url + "/prefs.html")
    label = page.locator("label[for=ads]").bounding_box()
    found = point_on(page.locator("#ads").element_handle(), label["x"] + 5, label["y"] + label["height"] / 2)
    assert found["centre_hits_other"] is False
