"""The tray's marker ring, shown by a terminal command (`qvl-agent run` in confirm mode) while it asks.

    python -m qvl_agent.ui.terminal_marker   (driven through stdin/stdout by `TerminalMarker`)

Qt aborts the whole process when its platform plugin cannot start, so the marker lives in a child
process: the command writes `show X Y LABEL` or `hide` on its stdin and waits for the line `ok`, which
the child writes once the X server has the ring on screen (or has unmapped it, and the windows below
have had a moment to repaint: the marker is neither clicked nor in the next screenshot). A child that
cannot start or dies only means asking goes on without a marker.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

SHOW_WAIT_S = 1.0  # long enough for any X server to map a small window
HIDE_WAIT_S = 0.05  # the unmap reaches the server and the windows below repaint before the click
REPLY_TIMEOUT_S = 15.0  # the child's first reply includes importing PySide6


class TerminalMarker:
    """The parent's handle; every method is a no-op once the child is gone."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._shown = False

    def _send(self, line: str) -> bool:
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "qvl_agent.ui.terminal_marker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        proc = self._proc
        if proc.poll() is not None:
            return False
        reply: list[str] = []
        try:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            reader = threading.Thread(target=lambda: reply.append(proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(REPLY_TIMEOUT_S)
        except OSError:
            return False
        if not reply or reply[0].strip() != "ok":
            self.close()
            return False
        return True

    def show(self, x: int, y: int, label: str = "") -> bool:
        """Ring physical pixel (x, y); True once it is on screen."""
        self._shown = self._send(f"show {int(x)} {int(y)} {' '.join(label.split())}")
        return self._shown

    def hide(self) -> None:
        if self._shown:
            self._shown = False
            self._send("hide")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def _pump(app, seconds: float, until=lambda: False) -> None:
    deadline = time.monotonic() + seconds
    while True:
        app.processEvents()
        if until() or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def main() -> int:
    from PySide6.QtWidgets import QApplication

    from qvl_agent.ui.overlay import ClickMarker

    app = QApplication.instance() or QApplication(["qvl-agent-marker"])
    marker = ClickMarker()
    for line in sys.stdin:
        word, _, rest = line.strip().partition(" ")
        if word == "show":
            x, y, label = (rest.split(" ", 2) + [""])[:3]
            marker.show_at(int(x), int(y), label)
            handle = marker.windowHandle()
            _pump(app, SHOW_WAIT_S, lambda: handle is not None and handle.isExposed())  # noqa: B023
            marker.repaint()
            _pump(app, 0.02)
        elif word == "hide":
            marker.hide()
            _pump(app, HIDE_WAIT_S)
        print("ok", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
