"""A virtual X display with a window manager that has a system tray, for end-to-end tests.

`scripts/test` starts one (Xvfb :99 + jwm) and exports DISPLAY; when the tests run without it, each
pytest session starts its own on a free display number, so parallel runs never share a pointer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

JWMRC = Path(__file__).with_name("jwmrc")


def display_works(display: str) -> bool:
    if not display or not shutil.which("xdpyinfo"):
        return False
    env = dict(os.environ, DISPLAY=display)
    return subprocess.run(["xdpyinfo"], env=env, capture_output=True, timeout=10).returncode == 0


def tray_ready(display: str) -> bool:
    """Whether a system tray owns the display's tray selection (jwm takes it once it has started): a tray
    app started before that would find no tray, however long a fixed sleep waited on a loaded machine."""
    from Xlib import display as xdisplay

    try:
        conn = xdisplay.Display(display)
        try:
            return conn.get_selection_owner(conn.intern_atom("_NET_SYSTEM_TRAY_S0")) != 0
        finally:
            conn.close()
    except Exception:  # not up yet, or gone (another Xvfb won its number): Xlib raises several kinds
        return False


class VirtualDisplay:
    """Xvfb at 1920x1080x24 plus jwm; `stop()` ends both."""

    def __init__(self, width: int = 1920, height: int = 1080):
        self.width, self.height = width, height
        self.procs: list[subprocess.Popen] = []
        self.display = ""

    def start(self, attempts: int = 5) -> str:
        """Start Xvfb on a display number it picks itself, and jwm; the display once jwm owns the tray.
        Several Xvfb started at once (parallel workers, two runs on one machine) can race for one number,
        and the loser exits: then a fresh one is started, up to `attempts` times."""
        if not shutil.which("Xvfb") or not shutil.which("jwm"):
            raise RuntimeError("Xvfb and jwm are needed: run scripts/setup (apt: xvfb jwm x11-utils).")
        for _ in range(attempts):
            if self._try_start():
                return self.display
            self.stop()
        raise RuntimeError(f"No virtual display came up with jwm's tray in {attempts} tries.")

    def _try_start(self) -> bool:
        self.procs, self.display = [], ""
        rfd, wfd = os.pipe()
        xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(wfd), "-screen", "0", f"{self.width}x{self.height}x24", "-nolisten", "tcp"],
            pass_fds=(wfd,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(wfd)
        self.procs.append(xvfb)
        with os.fdopen(rfd) as fh:
            number = fh.readline().strip()
        if not number:
            return False
        self.display = f":{number}"
        env = dict(os.environ, DISPLAY=self.display)
        self.procs.append(
            subprocess.Popen(["jwm", "-f", str(JWMRC)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        deadline = time.monotonic() + 15
        while not (display_works(self.display) and tray_ready(self.display)):
            if xvfb.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return xvfb.poll() is None

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def ensure_runtime_dir() -> None:
    """Qt wants a private XDG_RUNTIME_DIR."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        path = tempfile.mkdtemp(prefix="qvl-runtime-")
        os.chmod(path, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = path
