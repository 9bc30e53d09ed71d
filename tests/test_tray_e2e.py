"""`qvl-agent tray` end to end on a virtual display with a window manager that has a system tray.

The app runs as a user would start it and is watched only from outside: xdotool presses the real hotkeys,
types into the real windows, clicks the real tray menu and finds windows by their titles; the notices
the app prints on stderr say what it told the person; Copy puts the answer on the clipboard; the screen
itself shows where the marker is and what it covers.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time

import pytest

from qvl_agent.playwright.chromium import find_browser
from tests.support.tray import (
    Tray,
    centre,
    clipboard,
    geometry,
    grab,
    visible_windows,
    wait_gone,
    wait_window,
    xdo,
)

pytestmark = [pytest.mark.display, pytest.mark.slow]

ASK_TITLE = "^qvl-agent: ask about the screen$"
REGION_ASK_TITLE = "^qvl-agent: ask about the region$"
MARKER_TITLE = "^qvl-agent marker$"
REPLY = "The screen shows a **desktop** with a tray at the bottom."
COPIED = REPLY  # Copy gives the answer as the model wrote it (Markdown)


def call(action: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': 'computer_use', 'arguments': {'action': action, **args}})}</tool_call>"


@pytest.fixture
def tray_factory(x_display, tmp_path):
    if not all(shutil.which(tool) for tool in ("xdotool", "xprop", "xsetroot")):
        pytest.skip("xdotool, xprop and xsetroot are needed (scripts/setup installs them)")
    started: list[Tray] = []

    def start(replies, **kw) -> Tray:
        tray = Tray(x_display, tmp_path, replies, **kw)
        started.append(tray)
        return tray

    yield start
    for tray in started:
        tray.stop()


def open_ask_window(tray: Tray) -> tuple[str, float]:
    """Press Ctrl+Alt+Q; the ask window and the seconds from the key press until it was on screen."""
    t0 = time.monotonic()
    xdo(tray.display, "key", "ctrl+alt+q")
    window = wait_window(tray.display, ASK_TITLE, timeout=20)
    return window, time.monotonic() - t0


def type_into(tray: Tray, window: str, text: str, then: str = "Return") -> None:
    xdo(tray.display, "windowactivate", "--sync", window, check=False)
    xdo(tray.display, "type", "--delay", "5", text)
    if then:
        xdo(tray.display, "key", then)


def copied_answer(tray: Tray, expected: str, timeout: float = 20.0) -> str:
    """Press Copy (Alt+C) until the answer, which begins with `expected`, is on the clipboard: Copy is enabled
    once the answer is complete."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        xdo(tray.display, "key", "alt+c")
        text = clipboard(tray.display)
        if text.startswith(expected):
            return text
        time.sleep(0.2)
    return text


def give_task(tray: Tray, task: str) -> None:
    """Run a task… (sent like the tray menu item), typed into its dialog."""
    assert tray.cli("tray", "--send", "task").returncode == 0
    dialog = wait_window(tray.display, "^qvl-agent: run a task")
    type_into(tray, dialog, task)


def test_hotkey_question_streamed_answer_and_quit_from_the_tray_menu(tray_factory):
    tray = tray_factory([REPLY])
    # Hotkeys are shown the way people write them.
    tray.wait_notice("Ready: press Ctrl+Alt+Q to ask about the screen, Ctrl+Alt+R for a region.")
    icon = tray.icon()
    assert not visible_windows(tray.display, "^qvl-agent launcher")  # the tray is there: no stand-in window
    assert not any("hotkeys" in line.lower() for line in tray.notices())  # no problem with the hotkeys

    # A second start for the same user says so and exits.
    second = tray.cli("tray", "--engine", "replay:/nonexistent.json")
    assert second.returncode == 1
    assert "already running" in second.stderr

    # Press the hotkey several times (Esc closes the window each time) to measure key -> window on screen.
    latencies = []
    for _ in range(5):
        _window, latency = open_ask_window(tray)
        latencies.append(latency)
        xdo(tray.display, "key", "Escape")
        wait_gone(tray.display, ASK_TITLE)
    print(f"\nkey press -> ask window on screen: median {statistics.median(latencies) * 1000:.0f} ms "
          f"over {len(latencies)} runs: {[round(x * 1000) for x in latencies]}")  # fmt: skip

    window, _ = open_ask_window(tray)
    type_into(tray, window, "What is on my screen?")
    assert copied_answer(tray, COPIED) == COPIED

    # Quit through the real tray menu: right-click the icon, click Quit (the last item).
    xdo(tray.display, "mousemove", *map(str, centre(tray.display, icon)))
    xdo(tray.display, "click", "3")
    x, y, w, h = geometry(tray.display, tray.popup_menu())
    xdo(tray.display, "mousemove", str(x + w // 2), str(y + h - h // 10))
    xdo(tray.display, "click", "1")
    assert tray.proc.wait(20) == 0
    assert not visible_windows(tray.display, ASK_TITLE)


def test_a_hotkey_after_the_model_failed_to_load_says_why(tray_factory, tmp_path):
    # A model directory that is not there: the engine never becomes ready, the hotkey must not block.
    missing = tmp_path / "no-such-model"
    tray = tray_factory([], env={"QVL_ENGINE": "local", "QVL_MODEL": str(missing)}, args=[])
    failed = tray.wait_notice("no-such-model", timeout=120)
    assert "Traceback" not in failed
    for window in visible_windows(tray.display, ASK_TITLE):  # one a press during the load may have opened
        xdo(tray.display, "windowactivate", "--sync", window, check=False)
        xdo(tray.display, "key", "Escape")
    wait_gone(tray.display, ASK_TITLE)
    # Press until the hotkey listener, which starts with the app, answers.
    t0 = time.monotonic()
    deadline = time.monotonic() + 60
    while not any("not available" in line for line in tray.notices(after=t0)):
        assert time.monotonic() < deadline, f"the hotkey got no answer; stderr: {tray.notices()}"
        xdo(tray.display, "key", "ctrl+alt+q")
        time.sleep(0.5)
    assert not visible_windows(tray.display, ASK_TITLE)
    # Still responsive: it takes the quit command from another process.
    tray.quit()


def test_corrupt_settings_give_a_notice_and_stay_where_they_are(tray_factory, tmp_path):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "config.toml").write_text("max_pixels = [this is not toml\n")
    tray = tray_factory([REPLY], config_dir=config_dir)
    tray.wait_notice("Ready:")
    assert any("not valid TOML" in m and "defaults are used" in m for m in tray.notices())
    assert (config_dir / "config.toml").read_text() == "max_pixels = [this is not toml\n"
    assert not list(config_dir.glob("config.toml.*"))  # nothing renamed or set aside
    tray.quit()


def test_without_a_system_tray_a_launcher_window_stands_in(tmp_path):
    if not shutil.which("Xvfb") or not shutil.which("xdotool"):
        pytest.skip("Xvfb and xdotool are needed")
    rfd, wfd = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(wfd), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
        pass_fds=(wfd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(wfd)
    with os.fdopen(rfd) as fh:
        display = ":" + fh.readline().strip()
    tray = Tray(display, tmp_path, [REPLY])  # bare Xvfb: no window manager, no tray
    try:
        tray.wait_notice("No system tray")
        launcher = wait_window(display, "^qvl-agent launcher$")
        tray.wait_notice("Ready:")
        _x, _y, width, height = geometry(display, launcher)
        assert width > 300 and height > 60  # sized to its buttons and text (see test_ui_widgets for the fit)
        tray.quit()
    finally:
        tray.stop()
        xvfb.terminate()
        xvfb.wait(10)


def test_region_hotkey_drag_asks_about_just_that_region_and_where_is_marks_inside_it(tray_factory):
    tray = tray_factory([call("left_click", coordinate=[500, 500]), REPLY])
    tray.wait_notice("Ready:")
    xdo(tray.display, "mousemove", "400", "300")
    xdo(tray.display, "key", "ctrl+alt+r")
    wait_window(tray.display, "^qvl-agent region$")
    time.sleep(0.3)  # let the window manager map the full-screen overlay
    xdo(tray.display, "mousemove", "400", "300")
    xdo(tray.display, "mousedown", "1")
    xdo(tray.display, "mousemove", "600", "400")
    xdo(tray.display, "mousemove", "700", "450")
    xdo(tray.display, "mouseup", "1")
    window = wait_window(tray.display, REGION_ASK_TITLE)
    assert not visible_windows(tray.display, ASK_TITLE)  # it says "region", not "screen"
    # The middle of what the model saw is the middle of the dragged 300x150 region at (400, 300).
    type_into(tray, window, "the middle", then="alt+w")
    assert centre(tray.display, wait_window(tray.display, MARKER_TITLE)) == (550, 375)
    type_into(tray, window, "What is here?")
    assert copied_answer(tray, COPIED) == COPIED
    assert not visible_windows(tray.display, MARKER_TITLE)  # a new question takes the marker away
    tray.quit()


def test_where_is_puts_a_ring_on_the_point_that_leaves_the_target_visible(tray_factory):
    tray = tray_factory([call("left_click", coordinate=[500, 500])])
    env = dict(os.environ, DISPLAY=tray.display)
    subprocess.run(["xsetroot", "-solid", "#3366aa"], env=env, check=True)  # a desktop that is not black
    desktop = (0x33, 0x66, 0xAA)
    try:
        tray.wait_notice("Ready:")
        window, _ = open_ask_window(tray)
        cx, cy = 960, 540  # 500/1000 of the 1920x1080 monitor: the model saw the whole screen
        x, y, w, h = geometry(tray.display, window)
        assert x <= cx < x + w and y <= cy < y + h  # the ask window opens over the middle of the screen
        type_into(tray, window, "the middle of the screen", then="alt+w")
        marker = wait_window(tray.display, MARKER_TITLE)
        assert centre(tray.display, marker) == (cx, cy)
        # The ask window stepped aside, so the person sees what was found.
        x, y, w, h = geometry(tray.display, window)
        assert not (x - 30 <= cx < x + w + 30 and y - 30 <= cy < y + h + 30), (x, y, w, h)
        time.sleep(0.5)
        seen = grab(tray.display, cx - 30, cy - 30, 61, 61)
        # The target and the corners of the marker's square show the desktop: only a ring is drawn, no box.
        for dy in range(-5, 6):
            for dx in range(-5, 6):
                assert seen[30 + dy][30 + dx] == desktop, f"the marker covers ({dx}, {dy})"
        for dx, dy in ((-23, -23), (23, -23), (-23, 23), (23, 23)):
            assert seen[30 + dy][30 + dx] == desktop, f"the marker's square shows at ({dx}, {dy})"
        # The ring itself is drawn in red around the target.
        ring = [seen[30 + dy][30 + dx] for dx, dy in ((-22, 0), (22, 0), (0, -22), (0, 22))]
        assert all(r > 180 and g < 80 and b < 80 for r, g, b in ring), ring
        xdo(tray.display, "windowactivate", "--sync", window, check=False)
        xdo(tray.display, "key", "Escape")
        wait_gone(tray.display, MARKER_TITLE)  # closing the window takes the marker away
        tray.quit()
    finally:
        subprocess.run(["xsetroot", "-solid", "black"], env=env, check=False)


def test_run_a_task_clicks_on_the_desktop_after_showing_the_marker(tray_factory):
    # Auto mode: no yes/no dialog, the marker alone announces the click.
    tray = tray_factory(
        [call("left_click", coordinate=[500, 500]), call("terminate", status="success")],
        env={"QVL_SAFETY_MODE": "auto"},
    )
    tray.wait_notice("Ready:")
    t0 = time.monotonic()
    give_task(tray, "Click the middle of the screen")
    started = "Working on “Click the middle of the screen”: press Ctrl+Alt+Esc to stop, Ctrl+Alt+T to take over."
    tray.wait_notice(started, after=t0)
    assert centre(tray.display, wait_window(tray.display, MARKER_TITLE)) == (960, 540)
    tray.wait_notice("Task done: The model ended the task: success.", after=t0)
    assert not visible_windows(tray.display, MARKER_TITLE)
    tray.quit()


def test_a_dry_run_from_the_tray_says_nothing_was_done_and_lists_what_it_would_have_run(tray_factory):
    tray = tray_factory(
        [call("left_click", coordinate=[500, 500]), call("terminate", status="success")],
        env={"QVL_SAFETY_MODE": "dry-run"},
    )
    tray.wait_notice("Ready:")
    xdo(tray.display, "mousemove", "17", "23")
    t0 = time.monotonic()
    give_task(tray, "Click the middle of the screen")
    said = tray.wait_notice("Dry run finished", "Task done", after=t0)
    assert "Dry run finished, nothing was clicked or typed" in said and "Task done" not in said, said
    tray.wait_notice("Would have run (1 action):", after=t0)
    tray.wait_notice("1. left_click at (500, 500) -> pixel (960, 540)", after=t0)
    location = xdo(tray.display, "getmouselocation").stdout
    assert location.startswith("x:17 y:23 "), location  # nothing moved
    tray.quit()


@pytest.mark.browser
def test_with_a_browser_focused_the_ask_window_offers_a_playwright_script(tray_factory, tmp_path):
    chromium = find_browser()  # found the way the product finds it; none is a failure, not a skip
    tray = tray_factory(["The address bar shows http://127.0.0.1:9/.", REPLY])
    tray.wait_notice("Ready:")
    browser = subprocess.Popen(
        [chromium, "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}", "--no-first-run",
         "--disable-gpu", "--disable-background-networking", "about:blank"],
        env=dict(os.environ, DISPLAY=tray.display), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (windows := xdo(tray.display, "search", "--onlyvisible", "--class", "chromium", check=False)
                   .stdout.split()):  # fmt: skip
            assert time.monotonic() < deadline, "Chromium did not open a window"
            time.sleep(0.1)
        xdo(tray.display, "windowactivate", "--sync", windows[-1], check=False)
        time.sleep(0.3)
        window, _ = open_ask_window(tray)
        # Playwright script (Alt+P) reads the address and asks the person to confirm it.
        t0 = time.monotonic()
        type_into(tray, window, "Save the page", then="alt+p")
        dialog = wait_window(tray.display, "^qvl-agent: Playwright script$")
        xdo(tray.display, "windowactivate", "--sync", dialog, check=False)
        xdo(tray.display, "key", "Escape")
        tray.wait_notice("No Playwright script: no page address was given.", after=t0)
        xdo(tray.display, "windowactivate", "--sync", window, check=False)
        xdo(tray.display, "key", "Escape")
        wait_gone(tray.display, ASK_TITLE)
    finally:
        browser.terminate()
        browser.wait(10)
    # Without a browser in focus the button is not offered: Alt+P does nothing, and the next question
    # gets the next reply (a script run would have taken it).
    time.sleep(0.5)
    window, _ = open_ask_window(tray)
    t1 = time.monotonic()
    type_into(tray, window, "What is here?", then="alt+p")
    xdo(tray.display, "key", "Return")
    assert copied_answer(tray, COPIED) == COPIED
    assert not visible_windows(tray.display, "^qvl-agent: Playwright script$")
    assert not any("Playwright" in line for line in tray.notices(after=t1))
    tray.quit()


def test_without_a_display_the_tray_says_why_and_send_finds_nothing_running(tmp_path):
    from tests.conftest import run_cli

    env = {"DISPLAY": "", "WAYLAND_DISPLAY": "", "QVL_CONFIG_DIR": str(tmp_path / "config")}
    out = run_cli("tray", "--engine", "replay:/nonexistent.json", env=env)
    assert out.returncode == 2
    assert "DISPLAY is not set" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("tray", "--send", "bogus", env=env)
    assert out.returncode == 2 and "invalid choice" in out.stderr


@pytest.mark.display
def test_send_without_a_running_tray_says_so(x_display, tmp_path):
    from tests.conftest import run_cli

    out = run_cli("tray", "--send", "ask", env={"DISPLAY": x_display, "QVL_CONFIG_DIR": str(tmp_path / "c")})
    assert out.returncode == 2
    assert "not running" in out.stderr and "Traceback" not in out.stderr


def test_the_stop_hotkey_halts_a_running_task(tray_factory):
    tray = tray_factory([call("wait", time=60)], env={"QVL_SAFETY_MODE": "auto"})
    tray.wait_notice("Ready:")
    t0 = time.monotonic()
    give_task(tray, "Wait a minute")
    tray.wait_notice("Working on “Wait a minute”", after=t0)
    time.sleep(1.0)  # the agent is now inside its 60 s wait
    xdo(tray.display, "key", "ctrl+alt+Escape")
    tray.wait_notice("Task stopped: The stop hotkey was pressed.", after=t0, timeout=10)
    tray.quit()


def test_settings_open_above_an_ask_window_and_a_recorded_hotkey_works_at_once(tray_factory):
    tray = tray_factory([REPLY])
    tray.wait_notice("Ready:")
    ask_window, _ = open_ask_window(tray)  # stays on top of other windows
    t0 = time.monotonic()
    assert tray.cli("tray", "--send", "settings").returncode == 0
    dialog = wait_window(tray.display, "^qvl-agent settings$")
    time.sleep(0.5)
    # Where the two windows overlap (both open centred on the screen), the dialog must be the one seen.
    dx, dy, dw, dh = geometry(tray.display, dialog)
    ax, ay, aw, ah = geometry(tray.display, ask_window)
    x, y = max(dx, ax), max(dy, ay)
    w, h = min(dx + dw, ax + aw) - x, min(dy + dh, ay + ah) - y
    assert w * h > 0.5 * dw * dh, f"the windows hardly overlap: dialog {dx, dy, dw, dh}, ask window {ax, ay, aw, ah}"
    open_dialog = grab(tray.display, x, y, w, h)
    xdo(tray.display, "windowactivate", "--sync", dialog, check=False)
    # Engine, model, device, max pixels, then the ask hotkey: recorded by pressing the new combination.
    xdo(tray.display, "key", "Tab", "Tab", "Tab", "Tab")
    xdo(tray.display, "key", "ctrl+alt+a")
    xdo(tray.display, "key", "Return")
    saved = tray.wait_notice("Settings saved to", after=t0)
    assert "Reloading" not in saved
    # The dialog was in front: once it is gone, the ask window shows in its place.
    wait_gone(tray.display, "^qvl-agent settings$")
    time.sleep(0.5)
    behind = grab(tray.display, x, y, w, h)
    changed = sum(
        a != b for row_a, row_b in zip(open_dialog, behind, strict=True) for a, b in zip(row_a, row_b, strict=True)
    )
    assert changed > 0.3 * w * h, "the settings dialog opened behind the ask window"
    text = (tray.config_dir / "config.toml").read_text()
    assert 'ask = "<ctrl>+<alt>+a"' in text
    assert "replay:" not in text  # this run's --engine stays out of the file
    xdo(tray.display, "windowactivate", "--sync", ask_window, check=False)
    xdo(tray.display, "key", "Escape")
    wait_gone(tray.display, ASK_TITLE)
    xdo(tray.display, "key", "ctrl+alt+a")
    wait_window(tray.display, ASK_TITLE)
    tray.quit()


def test_settings_saved_with_nothing_changed_say_so_and_write_nothing(tray_factory):
    tray = tray_factory([REPLY])
    tray.wait_notice("Ready:")
    settings_file = tray.config_dir / "config.toml"
    before = settings_file.read_bytes() if settings_file.exists() else None
    t0 = time.monotonic()
    assert tray.cli("tray", "--send", "settings").returncode == 0
    dialog = wait_window(tray.display, "^qvl-agent settings$")
    x, y, w, h = geometry(tray.display, dialog)
    deadline = time.monotonic() + 30  # a loaded machine maps the window before it paints it
    while len(colours := {pixel for row in grab(tray.display, x, y, w, h) for pixel in row}) <= 5:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(colours) > 5, "the settings dialog is not drawn"
    xdo(tray.display, "windowactivate", "--sync", dialog, check=False)
    xdo(tray.display, "key", "Return")  # Save, with every field as it was
    said = tray.wait_notice("Nothing changed", "Settings saved", after=t0)
    assert "Nothing changed" in said and "Settings saved" not in said and str(settings_file) in said, said
    wait_gone(tray.display, "^qvl-agent settings$")
    after = settings_file.read_bytes() if settings_file.exists() else None
    assert after == before  # what the notice says is what happened on disk
    tray.quit()


def test_a_second_hotkey_press_reuses_the_ask_window_and_the_model_never_sees_our_windows(tray_factory):
    """The tray talks to a model server on 127.0.0.1 that keeps every image it is sent: the screenshot
    taken while an ask window is open shows the bare desktop, and the second press reuses that window.
    After Settings → Save reloads the model, the open window is closed (its conversation belonged to the
    old engine) and the next press works with the new one."""
    from io import BytesIO

    from PIL import Image

    from qvl_agent.config import Settings
    from qvl_agent.server.app import create_app
    from tests.support.live_server import EchoEngine, EchoSession, LiveServer

    seen: list = []

    class Recording(EchoSession):
        def _generate(self, text, images, options):
            seen.extend(images)
            return super()._generate(text, images, options)

    class RecordingEngine(EchoEngine):
        def open_session(self, images=(), system=None, tools=None):
            session = Recording(self, images, system, tools)
            self.sessions.append(session)
            return session

    token = "tray-model-server-token-0123"
    env = dict(os.environ, DISPLAY="")
    desktop = (0x33, 0x66, 0xAA)
    app = create_app(RecordingEngine(), Settings(model="recorder"), token=token)
    with LiveServer(app) as url:
        tray = tray_factory([], args=["--engine", f"openai:{url}/v1"], env={"QVL_API_KEY": token})
        env["DISPLAY"] = tray.display
        subprocess.run(["xsetroot", "-solid", "#3366aa"], env=env, check=True)
        try:
            tray.wait_notice("Ready:")
            xdo(tray.display, "mousemove", "300", "300")
            first, _ = open_ask_window(tray)
            type_into(tray, first, "one")
            assert copied_answer(tray, "echo:one", timeout=30).startswith("echo:one")
            # The second press, with the first window open in the middle of the screen.
            x, y, w, h = geometry(tray.display, first)
            xdo(tray.display, "key", "ctrl+alt+q")
            deadline = time.monotonic() + 20
            while len(seen) < 2:
                type_into(tray, wait_window(tray.display, ASK_TITLE), "two")
                assert time.monotonic() < deadline, "the second question never reached the model"
                time.sleep(0.5)
            assert visible_windows(tray.display, ASK_TITLE) == [first]  # one window, the same one
            shot = Image.open(BytesIO(seen[-1].to_png())).convert("RGB")
            assert shot.size == (1920, 1080)
            # Everything above the tray strip is the bare desktop: no ask window, no marker, nothing of ours.
            above_tray = shot.crop((0, 0, 1920, 1080 - 40))
            colours = dict((c, n) for n, c in above_tray.getcolors(1920 * 1080))
            assert set(colours) == {desktop}, f"the model saw more than the desktop where ({x}, {y}, {w}, {h}) was"

            # Settings → Save with a new pixel cap reloads the model and closes the open window.
            t0 = time.monotonic()
            assert tray.cli("tray", "--send", "settings").returncode == 0
            dialog = wait_window(tray.display, "^qvl-agent settings$")
            xdo(tray.display, "windowactivate", "--sync", dialog, check=False)
            xdo(tray.display, "key", "Tab", "Tab", "Tab", "ctrl+a")  # engine, model, device, max pixels
            xdo(tray.display, "type", "1000000")
            xdo(tray.display, "key", "Return")
            saved = tray.wait_notice("Settings saved to", after=t0)
            assert "Reloading" in saved and "ask windows were closed" in saved
            wait_gone(tray.display, ASK_TITLE)
            tray.wait_notice("Ready:", after=t0)
            again, _ = open_ask_window(tray)
            type_into(tray, again, "three")
            assert copied_answer(tray, "echo:three", timeout=30).startswith("echo:three")
            tray.quit()
        finally:
            subprocess.run(["xsetroot", "-solid", "black"], env=env, check=False)


def test_a_hotkey_pressed_while_the_model_loads_is_answered_once_it_is_ready(tray_factory, tiny_model_dir):
    env = {"QVL_ENGINE": "local", "QVL_MODEL": str(tiny_model_dir), "QVL_DEVICE": "cpu", "QVL_MAX_NEW_TOKENS": "8"}
    tray = tray_factory([], env=env, args=[])
    deadline = time.monotonic() + 60
    while not any("Still loading" in line for line in tray.notices()):
        assert not any("Ready:" in line for line in tray.notices()), "the model loaded before the hotkey worked"
        assert time.monotonic() < deadline, f"the hotkey got no answer; stderr: {tray.notices()}"
        xdo(tray.display, "key", "ctrl+alt+q")
        time.sleep(0.3)
    window = wait_window(tray.display, ASK_TITLE)  # the window opens at once, not after the load
    type_into(tray, window, "What is on the screen?")
    assert not any("Ready:" in line for line in tray.notices()), "too late to ask while loading"
    tray.wait_notice("Ready:", timeout=180)
    deadline = time.monotonic() + 60
    while not clipboard(tray.display):
        assert time.monotonic() < deadline, "the question asked while loading was never answered"
        xdo(tray.display, "key", "alt+c")
        time.sleep(0.3)
    assert len(visible_windows(tray.display, ASK_TITLE)) == 1
    tray.quit()
