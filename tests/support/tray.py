"""Driving `qvl-agent tray` from outside, as a person does: the app runs as its own process on a virtual
display; xdotool presses keys, moves the real pointer and finds windows by their titles; what the app
says reaches its stderr (every notice is printed there); the answer is read from the clipboard after
pressing Copy; what is on screen is read with mss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAY_STRIP = 32  # height of the jwm tray along the bottom of the screen (tests/support/jwmrc)


def xdo(display: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, DISPLAY=display)
    return subprocess.run(["xdotool", *args], env=env, capture_output=True, text=True, timeout=20, check=check)


def visible_windows(display: str, pattern: str) -> list[str]:
    """Visible windows whose title matches the regular expression `pattern`."""
    return xdo(display, "search", "--onlyvisible", "--name", pattern, check=False).stdout.split()


def wait_window(display: str, pattern: str, timeout: float = 15.0) -> str:
    """The newest visible window whose title matches `pattern`, once there is one."""
    deadline = time.monotonic() + timeout
    while not (windows := visible_windows(display, pattern)):
        if time.monotonic() > deadline:
            names = [xdo(display, "getwindowname", w, check=False).stdout.strip() for w in visible_windows(display, "")]
            shown = [name for name in names if name]
            raise AssertionError(f"no window titled {pattern!r} appeared within {timeout} s; on screen: {shown}")
        time.sleep(0.03)
    return windows[-1]


def wait_gone(display: str, pattern: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while visible_windows(display, pattern):
        assert time.monotonic() < deadline, f"the window titled {pattern!r} did not go away within {timeout} s"
        time.sleep(0.03)


def geometry(display: str, window: str) -> tuple[int, int, int, int]:
    """x, y, width, height of a window on the screen."""
    out = xdo(display, "getwindowgeometry", "--shell", window).stdout
    values = dict(line.split("=", 1) for line in out.split())
    return int(values["X"]), int(values["Y"]), int(values["WIDTH"]), int(values["HEIGHT"])


def centre(display: str, window: str) -> tuple[int, int]:
    x, y, w, h = geometry(display, window)
    return x + w // 2, y + h // 2


def window_type(display: str, window: str) -> str:
    env = dict(os.environ, DISPLAY=display)
    out = subprocess.run(["xprop", "-id", window, "_NET_WM_WINDOW_TYPE"], env=env, capture_output=True, text=True)
    return out.stdout


def clipboard(display: str) -> str:
    """The clipboard's text, read by a separate client the way a paste would."""
    code = "from PySide6.QtGui import QGuiApplication as A; a = A(['paste']); print(a.clipboard().text(), end='')"
    env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30).stdout


def grab(display: str, x: int, y: int, width: int, height: int) -> list[list[tuple[int, int, int]]]:
    """Rows of (r, g, b) pixels of a part of the screen, read by mss on a connection of its own to `display`
    (in this process: a Python started for each grab, and its pixels sent back as JSON, cost a test more
    CPU time than anything else it did)."""
    import mss

    with mss.MSS(display=display) as sct:
        rgb = sct.grab({"left": x, "top": y, "width": width, "height": height}).rgb
    pixels = list(zip(rgb[0::3], rgb[1::3], rgb[2::3], strict=True))
    return [pixels[r * width : (r + 1) * width] for r in range(height)]


class Tray:
    """A running `qvl-agent tray` and the lines it writes to stderr, each with the moment it arrived."""

    def __init__(self, display: str, tmp: Path, replies: list[str], config_dir: Path | None = None,
                 env: dict | None = None, args: list[str] | None = None):  # fmt: skip
        self.display = display
        replay = tmp / "replies.json"
        replay.write_text(json.dumps(replies))
        self.config_dir = config_dir or tmp / "config"
        self.env = dict(
            os.environ, DISPLAY=display, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1",
            QVL_CONFIG_DIR=str(self.config_dir), **(env or {}),
        )  # fmt: skip
        self.env.pop("QT_QPA_PLATFORM", None)
        args = ["--engine", f"replay:{replay}"] if args is None else args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qvl_agent", "tray", *args],
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def notices(self, after: float = 0.0) -> list[str]:
        return [line for t, line in list(self.lines) if t >= after]

    def wait_notice(self, *texts: str, after: float = 0.0, timeout: float = 30.0) -> str:
        """The first line on stderr since `after` (time.monotonic()) that contains one of `texts`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.notices(after):
                if any(text in line for text in texts):
                    return line
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"the tray app exited ({self.proc.returncode}): {self.notices()}")
            time.sleep(0.02)
        raise AssertionError(f"no notice with {texts} within {timeout} s; stderr: {self.notices()}")

    def windows(self) -> list[str]:
        """The app's visible windows."""
        return xdo(self.display, "search", "--onlyvisible", "--pid", str(self.proc.pid), check=False).stdout.split()

    def icon(self, timeout: float = 15.0) -> str:
        """The app's icon: its visible window inside the tray strip along the bottom of the screen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for window in self.windows():
                x, y, w, h = geometry(self.display, window)
                if y >= 1080 - TRAY_STRIP and 0 < w <= TRAY_STRIP:
                    return window
            time.sleep(0.05)
        raise AssertionError("the tray icon did not appear in the tray")

    def popup_menu(self, timeout: float = 10.0) -> str:
        """The app's visible popup menu."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for window in self.windows():
                if "POPUP_MENU" in window_type(self.display, window):
                    return window
            time.sleep(0.05)
        raise AssertionError("the tray menu did not open")

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "qvl_agent", *args], env=self.env, cwd=ROOT,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def quit(self) -> None:
        assert self.cli("tray", "--send", "quit").returncode == 0
        assert self.proc.wait(20) == 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
