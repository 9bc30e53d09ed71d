"""The ask window's Playwright script button: the model reads the address, the person confirms it, the
request runs in a real headless Chromium against a page served on 127.0.0.1, and the script it writes
replays the run with plain `python`."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from functools import partial

import pytest

from qvl_agent.capture import Screenshot
from qvl_agent.engine.replay import ReplayEngine

pytest.importorskip("pytestqt")
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


def call(action: str, **args) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "computer_use", "arguments": {"action": action, **args}})
        + "</tool_call>"
    )


def test_url_is_read_confirmed_and_the_run_becomes_a_replayable_script(qtbot, site, tmp_path):
    if not shutil.which("chromium") and not os.environ.get("QVL_BROWSER"):
        pytest.skip("needs Chromium (scripts/setup installs it)")
    from qvl_agent.config import Settings
    from qvl_agent.ui.engine_worker import EngineHost
    from qvl_agent.ui.script_flow import ScriptFlow, url_from_reply

    assert url_from_reply("The address bar shows `https://example.org/a?b=1`.") == "https://example.org/a?b=1"
    assert url_from_reply("NONE") == ""

    engine = ReplayEngine([
        f"The address bar shows {site}.",
        call("left_click", coordinate=[500, 500]),
        call("terminate", status="success"),
    ])  # fmt: skip
    host = EngineHost()
    events, guesses, opened = [], [], []
    try:
        with qtbot.waitSignal(host.ready, timeout=30_000):
            host.load(lambda: engine)
        flow = ScriptFlow(
            host, lambda: Settings(), lambda name, **d: events.append((name, d)),
            script_dir=tmp_path / "scripts", trace_root=tmp_path / "runs",
            confirm_url=lambda guess, _w: guesses.append(guess) or guess, open_file=opened.append,
        )  # fmt: skip
        shot = Screenshot(bytes(4 * 64 * 48), 64, 48, "BGRA", source="test")
        with qtbot.waitSignal(flow.finished, timeout=120_000) as done:
            flow.start("Place the order", shot)
    finally:
        host.close()
    assert guesses == [site]  # the person saw the address the model read
    assert "Wrote the Playwright script" in done.args[0], done.args[0]
    script = opened[0]
    source = script.read_text()
    assert site in source and "qvl_agent" not in source
    # The script replays the run without the model, in a fresh browser.
    env = dict(os.environ, QVL_BROWSER=os.environ.get("QVL_BROWSER") or shutil.which("chromium"))
    replay = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    # Only one image was sent with the address question, and the browser run used the browser prompt.
    assert len(engine.requests[0].image_hashes) == 1
    assert engine.requests[1].system and engine.requests[1].system != engine.requests[0].system


def test_no_address_means_no_run(qtbot, tmp_path):
    from qvl_agent.config import Settings
    from qvl_agent.ui.engine_worker import EngineHost
    from qvl_agent.ui.script_flow import ScriptFlow

    engine = ReplayEngine(["NONE"])
    host = EngineHost()
    try:
        with qtbot.waitSignal(host.ready, timeout=30_000):
            host.load(lambda: engine)
        flow = ScriptFlow(host, lambda: Settings(), lambda *a, **k: None, script_dir=tmp_path,
                          confirm_url=lambda guess, _w: None)  # fmt: skip
        with qtbot.waitSignal(flow.finished, timeout=30_000) as done:
            flow.start("Anything", Screenshot(bytes(4 * 64 * 48), 64, 48, "BGRA"))
    finally:
        host.close()
    assert "no page address" in done.args[0]
    assert len(engine.requests) == 1
