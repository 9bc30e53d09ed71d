"""The banner of a paused run: "Paused: you have control — <reason>" and a "Hand back" button.

A small always-on-top window outside the page (the page's own DOM cannot see, hide or press it), shown
while the person has taken a run over (`takeover.py`). It runs as a child process with a Qt event loop of
its own (`python -m qvl_agent.ui.banner TEXT`), because the command's main thread is busy with the run
(Playwright's sync API and the step loop); the child prints `hand back` on its stdout when the button is
pressed, and is ended when the run goes on. Without a display or Qt the child just exits: the terminal
line and the hotkey still work.

`PauseNotice` is the command's side: `show(state, reason)` for `TakeOver`, a terminal line each time and
the banner while paused.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

from qvl_agent.actions import printable

HAND_BACK = "hand back"


class PauseNotice:
    """Tells the person that a run is paused or going on again: a line on the terminal and, with
    `banner`, the banner window whose button calls `on_hand_back`."""

    def __init__(self, hotkey: str, on_hand_back: Callable[[], None], *, banner: bool = True, stream=None):
        self.hotkey = hotkey
        self.on_hand_back = on_hand_back
        self.banner = banner
        self.stream = stream
        self._child: subprocess.Popen | None = None

    def __call__(self, state: str, reason: str) -> None:
        out = self.stream or sys.stderr
        if state == "paused":
            why = f" ({printable(reason)})" if reason else ""
            keys = f"press {self.hotkey} or " if self.hotkey else ""
            print(f"qvl-agent: paused{why}: you have control; {keys}use the banner's Hand back button to hand "
                  "the run back.", file=out, flush=True)  # fmt: skip
            if self.banner:
                self._open(reason)
        else:
            self.close()
            print("qvl-agent: handed back: the agent goes on.", file=out, flush=True)

    def _open(self, reason: str) -> None:
        self.close()
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "qvl_agent.ui.banner", printable(reason)[:300]],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            return  # the terminal line said it already
        self._child = child
        threading.Thread(target=self._read, args=(child,), daemon=True).start()

    def _read(self, child: subprocess.Popen) -> None:
        for line in child.stdout:
            if line.strip() == HAND_BACK and child is self._child:
                self.on_hand_back()

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def banner_text(reason: str) -> str:
    return f"Paused: you have control — {reason}" if reason else "Paused: you have control"


def main(argv: list[str]) -> int:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QHBoxLayout, QLabel, QPushButton, QWidget

    app = QApplication([sys.argv[0]])
    window = QWidget()
    window.setWindowTitle("qvl-agent: paused")
    # On top, but never taking the keyboard from the window the person is typing into.
    flags = Qt.WindowType.WindowStaysOnTopHint | Qt.WindowType.Tool | Qt.WindowType.WindowDoesNotAcceptFocus
    window.setWindowFlags(flags)
    window.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
    label = QLabel(banner_text(argv[0] if argv else ""))
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)  # the model's words, never markup
    button = QPushButton("Hand back")

    def hand_back() -> None:
        print(HAND_BACK, flush=True)
        button.setEnabled(False)

    button.clicked.connect(hand_back)
    layout = QHBoxLayout(window)
    layout.addWidget(label, 1)
    layout.addWidget(button)
    window.setMinimumWidth(420)
    window.setStyleSheet("background: #fff4c2; color: #222;")
    screen = app.primaryScreen().availableGeometry()
    window.adjustSize()
    window.move(screen.x() + (screen.width() - window.width()) // 2, screen.y() + 8)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
