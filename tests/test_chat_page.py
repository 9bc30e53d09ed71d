"""The chat page in headless Chromium against `qvl-agent serve` with the tiny model: open the printed
address, pick a screenshot, ask, watch the answer stream in, and see the follow-up's features cached.
The model's Markdown is rendered without letting any HTML in it reach the page as HTML."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.support.live_server import start_serve, stop_serve

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.same_worker]  # one Chromium for the module
CHROMIUM_ARGS = [
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    config = tmp_path_factory.mktemp("chat-config")
    # No QVL_API_TOKEN: the server creates its token file, and the address it prints carries the token.
    url, proc, printed = start_serve(
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        config_dir=config,
        token=None,
        env={"QVL_MAX_NEW_TOKENS": "24"},
    )
    page_url = next(line for line in printed if line.startswith("Chat page: ")).split()[2]
    assert "?token=" in page_url
    yield url, page_url
    assert stop_serve(proc) == 0


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module's tests, each in a context of its own (no cookie, storage or cache of
    another test's). Module scope, not session: Playwright's sync API allows one instance per thread, and
    other modules start their own."""
    from playwright.sync_api import sync_playwright

    from qvl_agent.playwright.chromium import find_browser

    with sync_playwright() as p:
        executable = find_browser(playwright_default=p.chromium.executable_path)
        browser = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture()
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == []


def test_pick_ask_stream_and_follow_up_with_cached_features(served, page, tmp_path):
    from playwright.sync_api import expect

    url, page_url = served
    shot = tmp_path / "screen.png"
    Image.new("RGB", (160, 120), (30, 140, 220)).save(shot)

    page.goto(page_url)
    expect(page.locator("#model")).not_to_have_text("")
    assert "token=" not in page.url  # taken out of the address bar once read
    page.set_input_files("#file", str(shot))
    expect(page.locator("#preview")).to_be_visible()

    page.fill("#question", "What is on this screen?")
    page.get_by_role("button", name="Ask").click()
    first = page.locator(".msg.assistant").nth(0)
    expect(first).to_have_attribute("data-state", "done", timeout=60_000)
    assert int(first.get_attribute("data-pieces")) > 1  # it arrived piece by piece
    assert first.locator(".text").inner_text() != ""
    expect(first.locator(".stats")).to_contain_text("first token")
    expect(first).to_have_attribute("data-vision", "miss")
    expect(first.locator(".vision")).to_have_text("features computed")

    page.fill("#question", "And what colour is it?")
    page.locator("#question").press("Enter")  # Enter sends, as in any chat
    second = page.locator(".msg.assistant").nth(1)
    expect(second).to_have_attribute("data-state", "done", timeout=60_000)
    expect(second).to_have_attribute("data-vision", "hit")
    expect(second.locator(".vision")).to_have_text("features cached ✓")
    expect(second.locator(".stats")).to_contain_text("reused")  # prefill N tokens (M reused)


def test_without_the_token_the_page_says_where_to_find_it(page):
    from playwright.sync_api import expect

    from qvl_agent.config import Settings
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.server.app import create_app
    from tests.support.live_server import LiveServer

    # The server's app as `serve` builds it; the page it refuses with is the same whatever the model.
    app = create_app(ReplayEngine([]), Settings(model="replayed"), token="token-page-test-token-0123")
    with LiveServer(app) as url:
        for address in (url + "/", url + "/?token=wrong-token-0123456789"):
            response = page.goto(address)
            assert response.status == 401
            expect(page.locator("h1")).to_have_text("This page needs the server's token")
            text = page.locator("body").inner_text()
            assert "qvl-agent serve" in text and "/?token=" in text and "api_token" in text
            # A styled page, not a bare one: its card has a background and a border of its own.
            card = page.locator("main").evaluate("e => getComputedStyle(e).borderTopStyle")
            assert card == "solid"


ANSWER = """Here is **bold** and *italic* and `code`.

<img src=x onerror="window.__pwned = 'img'"><script>window.__pwned = 'script'</script>

- first item
- second with [a link](https://example.com/docs) and [bad](javascript:window.__pwned='link')

```
<b>not bold</b> stays text
```
"""


def test_markdown_is_rendered_and_html_from_the_model_never_runs(page, tmp_path):
    from playwright.sync_api import expect

    from qvl_agent.config import Settings
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.server.app import create_app
    from tests.support.live_server import LiveServer

    token = "markdown-test-token-0123"
    app = create_app(ReplayEngine([ANSWER]), Settings(model="replayed"), token=token)
    with LiveServer(app) as url:
        page.goto(f"{url}/?token={token}")
        page.fill("#question", "Show me some Markdown.")
        page.get_by_role("button", name="Ask").click()
        answer = page.locator(".msg.assistant").nth(0)
        expect(answer).to_have_attribute("data-state", "done", timeout=30_000)
        text = answer.locator(".text")
        expect(text.locator("strong")).to_have_text("bold")
        expect(text.locator("em")).to_have_text("italic")
        expect(text.locator("p code")).to_have_text("code")
        expect(text.locator("li")).to_have_count(2)
        expect(text.locator("pre code")).to_have_text("<b>not bold</b> stays text")
        links = text.locator("a")
        expect(links).to_have_count(1)
        assert links.get_attribute("href") == "https://example.com/docs"
        assert links.get_attribute("rel") == "noopener noreferrer"
        # The model's HTML is shown as the text it is, and none of it ran or became an element.
        expect(text).to_contain_text("<img src=x onerror=")
        expect(text).to_contain_text("<script>window.__pwned = 'script'</script>")
        assert text.locator("img, script, b").count() == 0
        expect(text.locator("li").nth(1)).to_contain_text("[bad](javascript:")  # plain text, not a link
        page.wait_for_timeout(300)
        assert page.evaluate("window.__pwned") is None


def test_a_reload_keeps_the_tab_signed_in_and_other_tabs_stay_locked_out(page):
    """The token leaves the address once read; the tab keeps it, so a reload still chats. A new tab or a
    new browser profile opened without the token gets the token page, and never the chat."""
    from playwright.sync_api import expect

    from qvl_agent.config import Settings
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.server.app import create_app
    from tests.support.live_server import LiveServer

    token = "reload-test-token-0123456"
    app = create_app(ReplayEngine(["Still here after the reload."]), Settings(model="replayed"), token=token)
    with LiveServer(app) as url:
        page.goto(f"{url}/?token={token}")
        expect(page.locator("#model")).to_have_text("replayed")
        assert "token=" not in page.url
        page.reload()
        expect(page.locator("#model")).to_have_text("replayed")
        assert page.url == url + "/"  # the address bar is clean again
        page.fill("#question", "Are you there?")
        page.get_by_role("button", name="Ask").click()
        answer = page.locator(".msg.assistant").nth(0)
        expect(answer).to_have_attribute("data-state", "done", timeout=30_000)
        expect(answer.locator(".text")).to_have_text("Still here after the reload.")

        browser = page.context.browser
        for other in (page.context.new_page(), browser.new_context().new_page()):
            response = other.goto(url + "/")
            assert response.status == 401
            expect(other.locator("h1")).to_have_text("This page needs the server's token")
            assert other.locator("#question").count() == 0 and other.url == url + "/"

        # A wrong token in the address is refused and forgets the kept one, so the tab does not loop.
        response = page.goto(f"{url}/?token=wrong-token-0123456789")
        assert response.status == 401
        page.reload()
        expect(page.locator("h1")).to_have_text("This page needs the server's token")


@pytest.mark.parametrize("size", [(1280, 800), (700, 900)], ids=["wide", "narrow"])
def test_a_long_answer_without_break_points_wraps_and_the_layout_holds(page, tmp_path, size):
    """5,000 characters without a space: the answer wraps inside its column, and the screenshot pane and the
    Ask button stay inside the window, where a person sees them."""
    import io

    from playwright.sync_api import expect

    from qvl_agent.config import Settings
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.server.app import create_app
    from tests.support.live_server import LiveServer

    width, height = size
    shot = tmp_path / "screen.png"
    Image.new("RGB", (160, 120), (30, 140, 220)).save(shot)
    token = "long-answer-token-0123456"
    answer = "A" * 2500 + "/" + "b" * 2499
    app = create_app(ReplayEngine([answer]), Settings(model="replayed"), token=token)
    with LiveServer(app) as url:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{url}/?token={token}")
        page.set_input_files("#file", str(shot))
        page.fill("#question", "Say it all in one word.")
        page.get_by_role("button", name="Ask").click()
        reply = page.locator(".msg.assistant").nth(0)
        expect(reply).to_have_attribute("data-state", "done", timeout=30_000)
        assert len(reply.locator(".text").inner_text()) == 5000

        def inside(selector: str) -> dict:
            box = page.locator(selector).bounding_box()
            assert box is not None, f"{selector} is not shown"
            assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"{selector} is off the window: {box}"
            assert box["y"] >= 0 and box["y"] + box["height"] <= height, f"{selector} is off the window: {box}"
            return box

        ask, preview, column = inside("#ask"), inside("#preview"), inside("#chat")
        expect(page.locator("#ask")).to_be_visible()
        expect(page.locator("#preview")).to_be_visible()
        text = reply.locator(".text").bounding_box()
        assert text["x"] + text["width"] <= column["x"] + column["width"]  # the long word wrapped
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
        # What the person sees: the Ask button's own blue where the page says it is, the screenshot's too.
        seen = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
        assert seen.getpixel((int(ask["x"] + 6), int(ask["y"] + ask["height"] / 2))) == (0x2F, 0x6F, 0xDD)
        middle = (int(preview["x"] + preview["width"] / 2), int(preview["y"] + preview["height"] / 2))
        assert seen.getpixel(middle) == (30, 140, 220)
