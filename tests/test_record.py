"""`qvl-agent record`: a person's work in a headed Chromium becomes a script that replays and heals.

The person is played by xdotool on the test's own X display: real pointer and key events into the
recorder's real Chromium window, the path a person's input takes (nothing reaches the browser through
Playwright or DevTools). Where to point is worked out without looking inside the recorder: each test page
draws a 4x4 magenta mark at the viewport's top-left corner, found on a grab of the X screen, and the
elements' boxes are measured in the test's own headless Chromium at the same viewport (the same page
renders the same way). The recorder is stopped as a terminal's Ctrl+C stops it: SIGINT to its process
group.

The recorded task spans two pages: sign in (a text field, a password, a checkbox clicked through its
label, the submit button), then cancel one order from a table (the row's own "Cancel" button) and
confirm in a dialog. The export replays it (the password from $QVL_SECRET_PASSWORD); on version B of the
site (the sign-in button renamed) it fails, and `replay --heal` with a grounding oracle repairs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qvl_agent.act.recorder import secret_name
from qvl_agent.playwright.locate import Located
from qvl_agent.playwright.recording import Reports, check_payload
from qvl_agent.playwright.signing import signed
from tests.conftest import ROOT
from tests.pages.helpers import ENV, MEASURING, VIEWPORT, WINDOWED_ENV
from tests.pages.server import PageServer
from tests.support.heal_oracle import DomGroundingOracle, start

PASSWORD = "s3cretPw9"


# --- unit: what a page may hand the recorder ------------------------------------------------------------


def test_a_payload_not_signed_with_the_key_or_of_the_wrong_shape_is_dropped():
    key = "ab" * 32

    def check(payload: dict, with_key: str = key, seq: int = 1):
        return check_payload(signed(json.dumps({**payload, "seq": seq, "doc": "0.5"}), bytes.fromhex(with_key)), key)

    good = {"kind": "key", "id": 3, "url": "http://x/", "keys": "Enter", "state": {"tag": "input"}}
    assert check(good)["keys"] == "Enter"
    assert check(good, with_key="cd" * 32) is None
    assert check_payload(dict(good, nonce=key, seq=1, doc="0.5"), key) is None  # not signed at all
    assert check_payload("0" * 64 + json.dumps(good), key) is None
    assert check(good, seq=0) is None
    assert check(dict(good, kind="eval")) is None
    assert check(dict(good, id=-1)) is None
    assert check(dict(good, id=True)) is None
    assert check(dict(good, keys="Enter\nimport os")) is None
    assert check(dict(good, state={"tag": ["input"]})) is None
    assert check(dict(good, state={"tag": "input", "checked": "yes"})) is None
    assert check(dict(good, url=None)) is None
    assert check_payload(signed('["not", "a", "dict"]', bytes.fromhex(key)), key) is None
    pointer = {"kind": "pointer", "id": 1, "url": "u", "x": 5, "y": 6, "button": 0, "count": 1}
    assert check(pointer)["x"] == 5.0
    assert check(dict(pointer, x=1e300)) is None
    assert check(dict(pointer, button=7)) is None
    assert check(dict(pointer, count=10**9)) is None
    extra = check(dict(good, state={"tag": "input", "onclick": "x"}, code="x"))
    assert "code" not in extra and extra["state"] == {"tag": "input"}
    reports = Reports(key)  # each document's reports once, in order
    first, second = (signed(json.dumps({**good, "seq": n, "doc": "0.5"}), bytes.fromhex(key)) for n in (1, 2))
    assert reports.open(first) and reports.open(second)
    assert reports.open(first) is None and reports.open(second) is None


def test_a_password_fields_secret_is_named_after_its_label():
    field = Located({"kind": "label", "text": "Password"})
    assert secret_name(field, {}, "a") == "PASSWORD"
    assert secret_name(field, {"PASSWORD": "a"}, "a") == "PASSWORD"
    assert secret_name(field, {"PASSWORD": "a"}, "b") == "PASSWORD_2"
    assert secret_name(Located({"kind": "role", "role": "textbox", "name": "PIN code"}), {}, "1") == "PIN_CODE"
    assert secret_name(Located({"kind": "css", "selector": "#x"}), {}, "1") == "PASSWORD"
    assert secret_name(Located({"kind": "label", "text": "2nd key"}), {}, "1") == "PASSWORD"


def test_the_model_says_each_recorded_step_in_words_masked_and_on_one_line(tmp_path):
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.image import Screenshot
    from qvl_agent.secrets import Secrets
    from qvl_agent.step_words import describe_steps
    from qvl_agent.trace import TraceWriter, read_trace

    trace = TraceWriter(tmp_path / "run")
    trace.start(task="t", mode="record")
    shot = Screenshot(bytes(64 * 48 * 4), 64, 48, "BGRA")
    click = {"action": "left_click", "coordinate": [500, 500]}
    for n in (1, 2):
        name = trace.screenshot(n, shot)
        result = {"action": 'click the "Sign in" button', "ok": True}
        trace.step({"step": n, "by": "person", "screenshot": name, "actions": [click], "results": [result]})
    trace.step({"step": 3, "reply": "a model's step", "actions": [], "results": []})  # not the person's
    trace.close()
    engine = ReplayEngine(['"Sign in as ada with hunter2"\nmore', "  \n" + "x" * 300])
    words = describe_steps(engine, read_trace(tmp_path / "run"), Secrets({"PASSWORD": "hunter2"}))
    assert words[1] == "Sign in as ada with {{PASSWORD}}"
    assert len(words[2]) == 120 and words[2].endswith("…")
    assert 3 not in words and engine.position == 2


# --- end to end: a person on the display ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def _display() -> str:
    return os.environ["DISPLAY"]  # set by the x_display fixture every test here takes


def _x(*args: str) -> None:
    subprocess.run(["xdotool", *args], check=True, timeout=30, env=dict(os.environ))


def viewport_origin(timeout: float = 30) -> tuple[int, int]:
    """Where the viewport's top-left CSS pixel is on the X screen: the page's magenta mark."""
    deadline, width = time.monotonic() + timeout, _screen_width()
    while time.monotonic() < deadline:
        data = screen()
        at = data.find(b"\xff\x00\xff")
        while at != -1:
            if at % 4 == 0 and data[at + 4 : at + 7] == b"\xff\x00\xff":
                return (at // 4) % width, (at // 4) // width
            at = data.find(b"\xff\x00\xff", at + 1)
        time.sleep(0.3)
    raise AssertionError("the recorder's page never showed on the display")


def _screen_width() -> int:
    from Xlib import display as xdisplay

    conn = xdisplay.Display(_display())
    try:
        return conn.screen().width_in_pixels
    finally:
        conn.close()


def screen() -> bytes:
    """The X screen's pixels as they are now (BGRX)."""
    from Xlib import X
    from Xlib import display as xdisplay

    conn = xdisplay.Display(_display())
    try:
        root = conn.screen().root
        geometry = root.get_geometry()
        return root.get_image(0, 0, geometry.width, geometry.height, X.ZPixmap, 0xFFFFFFFF).data
    finally:
        conn.close()


def _changed(one: bytes, other: bytes) -> int:
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(one, np.uint32) != np.frombuffer(other, np.uint32)))


# The browser's own dialog over the page dims the page behind it (most of the window's pixels), and one dialog
# after another differs by the box's text and fields (tens of thousands); a button's hover, press and focus
# ring change a few thousand at most, a text field's blinking caret a few dozen.
DIALOG_PIXELS, STILL_PIXELS = 15_000, 500


def wait_for_dialog(*before: bytes, what: str, timeout: float = 60) -> bytes:
    """The screen once a new dialog box is drawn on it: unlike each screen in `before` by a dialog's worth
    of pixels, and holding still (so its buttons and text field take keys). No page script runs while the
    browser's dialog is up, so the page cannot say when it is."""
    deadline = time.monotonic() + timeout
    last = screen()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = screen()
        if _changed(now, last) < STILL_PIXELS and all(_changed(now, seen) >= DIALOG_PIXELS for seen in before):
            return now
        last = now
    raise AssertionError(f"timed out waiting for {what}")


def centres(url: str, selectors: list[str], prepare: str = "") -> dict[str, tuple[float, float]]:
    """Each selector's box centre in CSS pixels, in the test's own headless Chromium (after `prepare`, a
    selector clicked first to bring up what the person will see): in a context of its own (no cookie,
    storage or cache shared) in the Chromium the browser tests measure pages in (tests/pages/helpers.py)."""

    def measure(browser) -> dict[str, tuple[float, float]]:
        found = {}
        context = browser.new_context(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]})
        try:
            page = context.new_page()
            page.goto(url)
            if prepare:
                page.route("**/record/**", lambda route: route.fulfill(status=204))
                page.locator(prepare).click()
            for selector in selectors:
                box = page.locator(selector).bounding_box()
                found[selector] = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        finally:
            context.close()
        return found

    return MEASURING.run(measure)


class Person:
    """Clicks and types on the X display, as a person at the recorder's window would."""

    def __init__(self, origin: tuple[int, int]):
        self.origin = origin

    def click(self, point: tuple[float, float], hold: float = 0.1) -> None:
        """A press of `hold` seconds (a person's lasts about 0.1 s); 0: xdotool's click, down and up at once."""
        x, y = round(self.origin[0] + point[0]), round(self.origin[1] + point[1])
        _x("mousemove", "--sync", str(x), str(y))
        if hold:
            _x("mousedown", "1")
            time.sleep(hold)
            _x("mouseup", "1")
        else:
            _x("click", "1")
        time.sleep(0.4)

    def type(self, text: str) -> None:
        _x("type", "--delay", "80", text)
        time.sleep(0.3)


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start_recording(tmp_path: Path, url: str, *extra: str) -> subprocess.Popen:
    """`qvl-agent record` in its own process group, as a terminal's foreground job is; returns once it says
    it is recording (its capture script is in the page by then). Its stderr goes to record.err."""
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", QVL_CONFIG_DIR=str(tmp_path / "config"), **WINDOWED_ENV
    )
    args = ["--url", url, "--export", str(tmp_path / "out.py"), "--trace-dir", str(tmp_path / "trace"), *extra]
    with open(tmp_path / "record.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "qvl_agent", "record", *args, "sign in and cancel order 1002"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    wait_for(lambda: "recording in the browser window" in errors(tmp_path) or proc.poll() is not None, "the recorder")
    assert proc.poll() is None, errors(tmp_path)
    return proc


def errors(tmp_path: Path) -> str:
    return (tmp_path / "record.err").read_text()


def ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl+C in the terminal sends: the whole group
    proc.wait(timeout=120)


def replay(tmp_path: Path, *args: str, secret: str = PASSWORD) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), QVL_CONFIG_DIR=str(tmp_path / "config"), **ENV)
    env["QVL_SECRET_PASSWORD"] = secret
    return subprocess.run(
        [sys.executable, "-m", "qvl_agent", "replay", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.browser
@pytest.mark.slow
def test_a_recorded_task_replays_keeps_the_password_out_and_heals(x_display, tmp_path, server):
    server.site = "a"
    server.clear()
    signin, orders = f"{server.url}/site/rec-signin.html", f"{server.url}/site/rec-orders.html"
    form = centres(signin, ["#user", "#pw", "label:has(#remember)", "#go"])
    row = centres(orders, ["tr:nth-of-type(2) button"])
    dialog = centres(orders, ["#yes"], prepare="tr:nth-of-type(2) button")

    proc = start_recording(tmp_path, signin)
    try:
        person = Person(viewport_origin())
        person.click(form["#user"])
        person.type("ada")
        person.click(form["#pw"])
        person.type(PASSWORD)
        person.click((form["label:has(#remember)"][0] + 30, form["label:has(#remember)"][1]))  # the label's text
        shown, asked = len(server.records("orders-shown")), len(server.records("asked"))  # the measuring's own
        person.click(form["#go"])
        wait_for(lambda: server.records("signin"), "the sign-in to post")
        wait_for(lambda: len(server.records("orders-shown")) > shown, "the orders page to be painted", 60)
        person.click(row["tr:nth-of-type(2) button"])
        wait_for(lambda: len(server.records("asked")) > asked, "the question to be painted", 60)
        person.click(dialog["#yes"])
        wait_for(lambda: server.records("cancel"), "the cancel to post", 60)
        time.sleep(0.5)
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    err = errors(tmp_path)
    assert proc.returncode == 0, err
    assert server.records("signin") == [{"user": "ada", "pw": PASSWORD, "remember": True}]
    assert server.records("cancel") == [{"order": "#1002"}]

    script = tmp_path / "out.py"
    source = script.read_text()
    assert 'page.get_by_role("textbox", name="User name", exact=True).fill("ada")' in source, source
    assert 'os.environ["QVL_SECRET_PASSWORD"]' in source
    assert 'page.get_by_role("checkbox", name="Remember me", exact=True).check()' in source
    assert re.search(r'page\.locator\("tr"\)\.filter\(has=page\.get_by_text\("#1002", exact=True\)\)'
                     r'\.get_by_role\("button", name="Cancel", exact=True\)\.click\(\)', source), source  # fmt: skip
    assert 'get_by_role("button", name="Yes, cancel it", exact=True).click()' in source
    assert "to_have_url(origin + " in source and "rec-orders.html" in source
    assert source.count("# intent: ") >= 5
    assert "The secret PASSWORD" not in err and "secret PASSWORD" in err
    for path in [script, *(tmp_path / "trace").iterdir()]:
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), f"the password is in {path.name}"
    trace = (tmp_path / "trace" / "trace.jsonl").read_text()
    assert '"by": "person"' in trace and "{{PASSWORD}}" in trace
    steps = [json.loads(line) for line in trace.splitlines() if '"type": "step"' in line]
    # The person's eight steps, and nothing of what the page itself handed the binding
    kinds = [step["actions"][0]["action"] for step in steps]
    assert kinds == ["left_click", "type", "left_click", "type", "left_click", "left_click", "left_click", "left_click"]
    assert all(step["by"] == "person" for step in steps)
    assert (tmp_path / "trace" / "report.html").is_file()

    # The export replays in the sandbox, the password from the environment.
    server.clear()
    again = replay(tmp_path, str(script), "-o", str(tmp_path / "replayed"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records("signin") == [{"user": "ada", "pw": PASSWORD, "remember": True}]
    assert server.records("cancel") == [{"order": "#1002"}]

    # The site changes (the button now says "Log in"): the script fails, and heals.
    server.site = "b"
    server.clear()
    broken = replay(tmp_path, str(script), "--step-timeout", "3", "-o", str(tmp_path / "broken"))
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert server.records("signin") == []
    oracle = DomGroundingOracle(signin, {'the "Sign in" button': "#go"})
    engine, httpd = start(oracle)
    try:
        server.clear()
        healed = replay(tmp_path, "--heal", "--engine", engine, "--trace-dir", str(tmp_path / "heals"),
                        "--step-timeout", "3", str(script))  # fmt: skip
    finally:
        httpd.shutdown()
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert oracle.problems == []
    assert server.records("signin") == [{"user": "ada", "pw": PASSWORD, "remember": True}]
    assert server.records("cancel") == [{"order": "#1002"}]
    assert 'get_by_role("button", name="Log in", exact=True).click()' in (tmp_path / "out.healed.py").read_text()


def _key(*keys: str) -> None:
    _x("key", "--delay", "120", *keys)
    time.sleep(0.4)


@pytest.mark.browser
@pytest.mark.slow
def test_closing_the_window_ends_the_recording_with_its_export(x_display, tmp_path, server):
    """Keys only after the first click (Tab to a list, an arrow to choose), then Ctrl+W closes the window:
    the recording still ends with the export, whose end state is what the page showed last. With
    --describe the model (here recorded replies) says each step's intent, and the intent lines carry it."""
    server.clear()
    url = f"{server.url}/rec-prefs.html"
    tip_button = '.tip:has-text("colours") button'
    at = {**centres(url, [tip_button]), **centres(url, ["#city", "#save"], prepare=tip_button)}
    said = [f"Intent number {n}" for n in range(1, 9)]
    replies = tmp_path / "words.json"
    replies.write_text(json.dumps(said))
    proc = start_recording(tmp_path, url, "--describe", "--engine", f"replay:{replies}")
    try:
        person = Person(viewport_origin())
        person.click(at[tip_button], hold=0)  # pressed and let go at once
        # the row goes (late, when the recorder held the click): the form moves up
        wait_for(lambda: server.records("tip-gone"), "the tip's row to go", 60)
        person.click(at["#city"])
        person.type("Oslo")
        _key("Tab")
        _key("Down")
        person.click(at["#save"])
        wait_for(lambda: server.records("prefs"), "the preferences to post")
        time.sleep(2.0)  # the recorder reads the quiet page
        _key("ctrl+w")
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    err = errors(tmp_path)
    assert proc.returncode == 0, err
    assert "the window was closed" in err
    recorded = (tmp_path / "trace" / "trace.jsonl").read_text()
    assert server.records("prefs") == [{"city": "Oslo", "colour": "green"}], recorded
    source = (tmp_path / "out.py").read_text()
    assert 'get_by_role("textbox", name="City", exact=True).fill("Oslo")' in source, source
    assert 'get_by_role("combobox", name="Colour", exact=True).select_option(label="green")' in source, source
    assert 'expect(page.get_by_text("Saved for Oslo"' in source, source
    tip = 'page.locator("div.tip").filter(has=page.get_by_text("Tip: colours follow the theme", exact=True))'
    assert f'{tip}.get_by_role("button", name="Dismiss", exact=True).click()' in source, source
    assert f"expect({tip}).to_have_count(0)" in source
    [save] = [line for line in source.splitlines() if line.startswith("    # intent: ") and '"name": "Save"' in line]
    assert re.search(r'"reason": "Intent number \d"', save), save
    assert json.loads((tmp_path / "trace" / "intents.json").read_text())

    server.clear()
    again = replay(tmp_path, str(tmp_path / "out.py"), "-o", str(tmp_path / "replayed"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records("prefs") == [{"city": "Oslo", "colour": "green"}]


def test_record_needs_a_display_and_a_new_export_file(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), QVL_CONFIG_DIR=str(tmp_path / "config"))
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    args = [sys.executable, "-m", "qvl_agent", "record", "--url", "http://127.0.0.1:9/"]
    headless = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert headless.returncode == 2
    assert "no display here" in headless.stderr and "Traceback" not in headless.stderr
    taken = tmp_path / "out.py"
    taken.write_text("mine")
    env["DISPLAY"] = os.environ.get("DISPLAY", ":0")
    again = subprocess.run([*args, "--export", str(taken)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert taken.read_text() == "mine"


@pytest.mark.browser
@pytest.mark.slow
def test_a_tab_the_person_opened_is_a_popup_in_the_script(x_display, tmp_path, server):
    """A click inside an iframe (kept as its pixel), a search sent with Enter (a navigation), a link
    opening a tab, work in that tab, then the stop hotkey: its own key press is no step."""
    server.clear()
    start_url, prefs = f"{server.url}/rec-start.html", f"{server.url}/rec-prefs.html"
    link, at = centres(start_url, ["#q", "#open", "#frame"]), centres(prefs, ["#city", "#save"])
    like = (link["#frame"][0] - 150 + 8 + 20, link["#frame"][1] - 30 + 8 + 10)  # the frame's button, inside it
    proc = start_recording(tmp_path, start_url)
    try:
        person = Person(viewport_origin())
        person.click(like)  # inside an iframe: no locator reaches it, so the script clicks its pixel
        wait_for(lambda: server.records("inner"), "the like to post")
        person.click(link["#q"])
        person.type("tea")
        _key("Return")  # submits the search: the page navigates before the recorder could read the field
        wait_for(lambda: server.records("results-shown"), "the search's results to be painted", 60)
        shown = len(server.records("prefs-shown"))  # the measuring's own
        person.click(link["#open"])
        # the new tab opens in the same window, its viewport where the first one's was
        wait_for(lambda: len(server.records("prefs-shown")) > shown, "the new tab to be painted", 60)
        person.click(at["#city"])
        person.type("Rome")
        person.click(at["#save"])
        wait_for(lambda: server.records("prefs"), "the preferences to post")
        time.sleep(0.5)
        _key("ctrl+alt+Escape")  # the stop hotkey ([hotkeys] stop)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    err = errors(tmp_path)
    assert proc.returncode == 0, err
    assert "the stop hotkey Ctrl+Alt+Esc ended it" in err
    source = (tmp_path / "out.py").read_text()
    assert "Escape" not in source and "Escape" not in (tmp_path / "trace" / "trace.jsonl").read_text()
    assert 'page.get_by_role("textbox", name="Search", exact=True).fill("tea")' in source, err
    assert 'page.get_by_role("textbox", name="Search", exact=True).press("Enter")' in source, source
    assert 'expect(page).to_have_url(origin + "/rec-start.html?q=tea")' in source
    assert "keyboard.type" not in source, source
    assert "with page.expect_popup() as popup:" in source, source
    assert 'page.get_by_role("link", name="Open the preferences", exact=True).click()' in source

    assert re.search(r"page\.mouse\.click\(\d+, \d+\)", source), source

    server.clear()
    again = replay(tmp_path, str(tmp_path / "out.py"), "-o", str(tmp_path / "replayed"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records("inner") == [{"liked": True}]
    assert server.records("prefs") == [{"city": "Rome", "colour": "red"}]
