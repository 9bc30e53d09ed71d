"""Helpers for the browser tests: replay files whose 0-1000 coordinates come from the real element boxes
of a page, measured in the test's own Playwright session at the viewport the run will use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from qvl_agent.errors import BrowserError
from qvl_agent.playwright.chromium import find_browser
from qvl_agent.scripts.export.exporter import SCRIPT_CHROMIUM_ARGS
from qvl_agent.scripts.write.policy import check_script
from tests.conftest import run_cli


def _chromium(headless: bool) -> str:
    """The Chromium the product would launch for a run without or with a window ($QVL_BROWSER, else a
    system one: a headless shell first where there is no window), or "" when there is none."""
    try:
        return find_browser(None, os.environ.get("QVL_BROWSER", ""), headless=headless)
    except BrowserError:
        return ""


CHROMIUM = _chromium(headless=True)
VIEWPORT = (1280, 800)
ENV = {"QVL_BROWSER": CHROMIUM}
# Runs that show a window (browse --headed, record, take-over) need a full Chromium.
WINDOWED_ENV = {"QVL_BROWSER": _chromium(headless=False)}


def call(**arguments) -> str:
    """One model reply: a computer_use tool call exactly as Qwen3-VL writes it."""
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": arguments}) + "\n</tool_call>"


def to_grid(px: float, py: float, viewport=VIEWPORT) -> list[int]:
    """A CSS pixel of the viewport as a point on the model's 0-1000 grid (what image.to_pixels inverts)."""
    return [round((px + 0.5) * 1000 / viewport[0]), round((py + 0.5) * 1000 / viewport[1])]


def element_centres(url: str, selectors: list[str], wait_for: str | None = None, viewport=VIEWPORT) -> dict:
    """Centre of each selector's box, as model coordinates, in a fresh context (after `wait_for` shows)."""
    plan = [("wait", wait_for)] if wait_for else []
    return measure_along(url, plan + [("measure", sel) for sel in selectors], viewport)


def click_at(point: list[int]) -> str:
    return call(action="left_click", coordinate=point)


def write_replay(path: Path, replies: list[str]) -> Path:
    path.write_text(json.dumps(replies), encoding="utf-8")
    return path


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_browser_below(pid: int) -> bool:
    """Kill the main Chromium process started (through Playwright's driver) by process `pid`."""
    for child in descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and b"chrom" in cmdline[0] and not any(a.startswith(b"--type=") for a in cmdline):
            os.kill(child, signal.SIGKILL)
            return True
    return False


class _MeasuringBrowser:
    """One Chromium for every measurement a test process makes, each in a context of its own (no cookie,
    storage or cache shared with another). Playwright's sync API runs one instance per thread and a test may
    drive its own in the main thread, so this one lives on a thread of its own and is handed the work."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._playwright = None
        self._browser = None

    def run(self, work):
        """`work(browser)` on the measuring thread; returns what it returns (or raises what it raises)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="measuring-browser")
        return self._pool.submit(self._run, work).result()

    def _run(self, work):
        if self._browser is None or not self._browser.is_connected():
            from playwright.sync_api import sync_playwright

            if self._playwright is None:
                self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=SCRIPT_CHROMIUM_ARGS)
        return work(self._browser)

    def close(self) -> None:
        if self._pool is None:
            return
        self._pool.submit(self._close).result()
        self._pool.shutdown()
        self._pool = None

    def _close(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()
        self._browser = self._playwright = None


MEASURING = _MeasuringBrowser()  # closed at the end of the session (tests/conftest.py)


def measure_along(url: str, plan: list[tuple], viewport=VIEWPORT) -> dict:
    """Walk a page as the run will, measuring on the way: plan items are ("measure", selector) for an
    element's centre, ("point", name, js) for the CSS pixel [x, y] that the function `js` returns in the
    page, ("click", selector), ("goto", url) or ("wait", selector) until it is attached; returns
    {selector or name: model point}. A fresh browser context each time (the browser is shared)."""

    def walk(browser) -> dict:
        centres = {}
        context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        try:
            page = context.new_page()
            page.goto(url)
            for what, sel, *js in plan:
                if what == "click":
                    page.click(sel)
                elif what == "goto":
                    page.goto(sel)
                elif what == "wait":
                    page.wait_for_selector(sel, state="attached")
                elif what == "point":
                    centres[sel] = to_grid(*page.evaluate(js[0]), viewport)
                else:
                    box = page.locator(sel).bounding_box()
                    centres[sel] = to_grid(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, viewport)
        finally:
            context.close()
        return centres

    return MEASURING.run(walk)


def browse(tmp_path: Path, url: str, replies: list[str], task: str, *extra: str):
    replay = write_replay(tmp_path / "replies.json", replies)
    env = dict(WINDOWED_ENV if "--headed" in extra else ENV, QVL_CONFIG_DIR=str(tmp_path / "config"))
    return run_cli(
        "browse",
        "--url",
        url,
        "--engine",
        f"replay:{replay}",
        "--export",
        str(tmp_path / "out.py"),
        "--trace-dir",
        str(tmp_path / "trace"),
        *extra,
        task,
        env=env,
        timeout=180,
    )


def replay_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    """`python out.py` as a user would run it: no qvl_agent on the path, a fresh browser."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(ENV)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=script.parent,
    )


def exported(tmp_path: Path) -> str:
    source = (tmp_path / "out.py").read_text()
    assert "qvl_agent" not in source
    check_script(source)  # exported scripts pass the same policy as model-written ones
    return source
