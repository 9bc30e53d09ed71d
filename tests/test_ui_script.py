"""The ask window's Playwright script button: the model reads the address, the person confirms it, the
model writes a script for the page served on 127.0.0.1 (as `qvl-agent playwright --verify` does), the
policy and a real headless Chromium check it, and the accepted script is saved and opened."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from functools import partial

import pytest

from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from tests.pages.helpers import CHROMIUM

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE = """<!doctype html><html><head><title>Order</title>
<style>body{margin:0} button{position:fixed;inset:0;width:100%;height:100%;font-size:40px}</style></head>
<body><button id="go" onclick="this.textContent='Order placed'">Place order</button></body></html>"""


@pytest.fixture(scope="session")
def qapp_args():
    return ["qvl-agent-tests", "-platform", "offscreen"]


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text(PAGE)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    server.server_close()


SCRIPT = """```python
import os
from playwright.sync_api import sync_playwright, expect

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("QVL_BROWSER") or None)
    page = browser.new_page()
    page.set_default_timeout(5000)
    page.goto("{url}")
    page.get_by_role("button", name="{button}", exact=True).click()
    expect(page.get_by_role("button", name="Order placed")).to_be_visible()
    browser.close()
```"""


def test_url_is_read_confirmed_and_a_verified_script_is_saved_and_opened(qtbot, site, tmp_path):
    if not CHROMIUM:
        pytest.skip("needs Chromium (scripts/setup installs it)")
    from qvl_agent.config import Settings
    from qvl_agent.ui.engine_worker import EngineHost
    from qvl_agent.ui.script_flow import ScriptFlow, url_from_reply

    assert url_from_reply("The address bar shows `https://example.org/a?b=1`.") == "https://example.org/a?b=1"
    assert url_from_reply("NONE") == ""

    engine = ReplayEngine([
        f"The address bar shows {site}.",
        SCRIPT.format(url=site, button="Order now"),  # no such button: verification fails, goes back
        SCRIPT.format(url=site, button="Place order"),
    ])  # fmt: skip
    host = EngineHost()
    guesses, opened, written = [], [], []
    try:
        with qtbot.waitSignal(host.ready, timeout=30_000):
            host.load(lambda: engine)
        flow = ScriptFlow(
            host, lambda: Settings(),
            script_dir=tmp_path / "scripts",
            confirm_url=lambda guess, _w: guesses.append(guess) or guess, open_file=opened.append,
        )  # fmt: skip
        flow.written.connect(written.append)
        shot = Screenshot(bytes(4 * 64 * 48), 64, 48, "BGRA", source="test")
        with qtbot.waitSignal(flow.finished, timeout=120_000) as done:
            flow.start("Place the order", shot)
    finally:
        host.close()
    assert guesses == [site]  # the person saw the address the model read
    assert "Wrote the Playwright script" in done.args[0], done.args[0]
    assert "attempt 1: running it failed" in done.args[0]
    assert "attempt 2: passed the policy and verification" in done.args[0]
    script = opened[0]
    assert script.read_text().count('name="Place order"') == 1
    # The saved script runs again with plain python and reaches the same end state.
    env = dict(os.environ, QVL_BROWSER=CHROMIUM)
    replay = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    # The address question and the script request each carried one screenshot: the screen, then the page.
    assert [len(r.image_hashes) for r in engine.requests] == [1, 1, 0]
    assert written == [str(script)]


def test_no_address_means_no_run(qtbot, tmp_path):
    from qvl_agent.config import Settings
    from qvl_agent.ui.engine_worker import EngineHost
    from qvl_agent.ui.script_flow import ScriptFlow

    engine = ReplayEngine(["NONE"])
    host = EngineHost()
    try:
        with qtbot.waitSignal(host.ready, timeout=30_000):
            host.load(lambda: engine)
        flow = ScriptFlow(host, lambda: Settings(), script_dir=tmp_path,
                          confirm_url=lambda guess, _w: None)  # fmt: skip
        with qtbot.waitSignal(flow.finished, timeout=30_000) as done:
            flow.start("Anything", Screenshot(bytes(4 * 64 * 48), 64, 48, "BGRA"))
    finally:
        host.close()
    assert "no page address" in done.args[0]
    assert len(engine.requests) == 1
