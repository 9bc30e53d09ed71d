"""The banner of a paused run: "Paused: you have control — <reason>" and a "Hand back" button.

A small always-on-top window outside the page (the page's own DOM cannot see, hide or press it), shown
while the person has taken a run over (`takeover.py`). It runs as a child process with a Qt event loop of
its own (`python -m qvl_agent.ui.banner [--private] -- TEXT`), because the command's main thread is busy with the run
(Playwright's sync API and the step loop); the child prints one line on its stdout for each thing the
person does with it, and is ended when the run goes on:

  - `hand back` when the button is pressed;
  - `private on` / `private off` when the "Keep what I type private" box is ticked or cleared (shown with
    `--private`, for desktop pauses: a browser's password fields are found without it);
  - `window X Y W H`, the banner's place on the desktop in pixels, once it is shown and whenever it moves:
    the person's presses there are no steps of theirs.

Without a display or Qt the child just exits: the terminal line and the hotkey still work.

`PauseNotice` is the command's side: `show(state, reason)` for `TakeOver`, a terminal line each time and
the banner while paused.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

from qvl_agent.actions import printable
from qvl_agent.image import Region

HAND_BACK = "hand back"
PRIVATE = "private"  # "private on", "private off"
WINDOW = "window"  # "window X Y W H"
PRIVATE_FLAG = "--private"
MAX_REASON = 300  # characters of the model's reason shown, on the terminal and in the banner


def shown_reason(reason: str) -> str:
    """The model's reason as the person reads it: control and bidi characters escaped, cut short."""
    said = printable(reason)
    return said if len(said) <= MAX_REASON else said[: MAX_REASON - 1] + "…"


def banner_command(reason: str, private: bool) -> list[str]:
    """The banner child's command line: the flag first, the reason after `--`, so that a reason that reads
    as the flag stays words and never shows a box that would not keep anything private."""
    return [sys.executable, "-m", "qvl_agent.ui.banner", *([PRIVATE_FLAG] if private else []), "--",
            shown_reason(reason)]  # fmt: skip


def banner_args(argv: list[str]) -> tuple[str, bool]:
    """(reason, private) from the banner child's arguments (`banner_command`)."""
    at = argv.index("--") if "--" in argv else len(argv)
    words = argv[at + 1 :]
    return (words[0] if words else ""), PRIVATE_FLAG in argv[:at]


class PauseNotice:
    """Tells the person that a run is paused or going on again: a line on the terminal and, with
    `banner`, the banner window whose button calls `on_hand_back`."""

    def __init__(
        self,
        hotkey: str,
        on_hand_back: Callable[[], None],
        *,
        banner: bool = True,
        stream=None,
        on_private: Callable[[bool], None] | None = None,
        on_window: Callable[[Region], None] | None = None,
    ):
        self.hotkey = hotkey
        self.on_hand_back = on_hand_back
        self.on_private = on_private  # with it, the banner has the "Keep what I type private" box
        self.on_window = on_window
        self.banner = banner
        self.stream = stream
        self._child: subprocess.Popen | None = None

    def __call__(self, state: str, reason: str) -> None:
        out = self.stream or sys.stderr
        if state == "paused":
            why = f" ({shown_reason(reason)})" if reason else ""
            keys = f"press {self.hotkey} or " if self.hotkey else ""
            private = " (tick its box to keep what you type private)" if self.on_private and self.banner else ""
            print(f"qvl-agent: paused{why}: you have control; {keys}use the banner's Hand back button{private} "
                  "to hand the run back.", file=out, flush=True)  # fmt: skip
            if self.banner:
                self._open(reason)
        else:
            self.close()
            print("qvl-agent: handed back: the agent goes on.", file=out, flush=True)

    def _open(self, reason: str) -> None:
        self.close()
        try:
            child = subprocess.Popen(
                banner_command(reason, self.on_private is not None),
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
            if child is not self._child:
                continue
            try:
                self._said(line.split())
            except Exception:  # the banner is a help: a line it got wrong must not end the run
                pass

    def _said(self, words: list[str]) -> None:
        if " ".join(words) == HAND_BACK:
            self.on_hand_back()
        elif words[:1] == [PRIVATE] and len(words) == 2 and self.on_private is not None:
            on = words[1] == "on"
            self.on_private(on)
            said = "what you type is kept private" if on else "what you type is recorded again"
            print(f"qvl-agent: {said}.", file=self.stream or sys.stderr, flush=True)
        elif words[:1] == [WINDOW] and len(words) == 5 and self.on_window is not None:
            self.on_window(Region(*(int(w) for w in words[1:])))

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
    from PySide6.QtCore import QObject, Qt
    from PySide6.QtWidgets import QApplication, QCheckBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

    reason, private = banner_args(argv)
    app = QApplication([sys.argv[0]])
    window = QWidget()
    window.setWindowTitle("qvl-agent: paused")
    # On top, but never taking the keyboard from the window the person is typing into.
    flags = Qt.WindowType.WindowStaysOnTopHint | Qt.WindowType.Tool | Qt.WindowType.WindowDoesNotAcceptFocus
    window.setWindowFlags(flags)
    window.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
    label = QLabel(banner_text(reason))
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)  # the model's words, never markup
    button = QPushButton("Hand back")

    def hand_back() -> None:
        print(HAND_BACK, flush=True)
        button.setEnabled(False)

    button.clicked.connect(hand_back)
    layout = QVBoxLayout(window)  # the words above; the box at the left and the button at the right below
    layout.addWidget(label)
    row = QHBoxLayout()
    if private:
        box = QCheckBox("Keep what I type private")
        box.toggled.connect(lambda on: print(f"{PRIVATE} {'on' if on else 'off'}", flush=True))
        row.addWidget(box)
    row.addStretch(1)
    row.addWidget(button)
    layout.addLayout(row)
    window.setMinimumWidth(420)
    window.setStyleSheet("background: #fff4c2; color: #222;")
    screen = app.primaryScreen().availableGeometry()
    window.adjustSize()
    # The lower right corner, where notices sit: clear of a browser's address bar and of the top of pages.
    window.move(screen.right() - window.width() - 8, screen.bottom() - window.height() - 8)

    class Place(QObject):
        """Says where the banner is whenever the window manager shows or moves it."""

        said = None

        def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
            if event.type() in (event.Type.Show, event.Type.Move, event.Type.Resize):
                frame, ratio = window.frameGeometry(), window.devicePixelRatio()  # Qt's pixels → the desktop's
                place = tuple(round(v * ratio) for v in (frame.x(), frame.y(), frame.width(), frame.height()))
                if place != self.said:
                    self.said = place
                    print(WINDOW, *place, flush=True)
            return False

    place = Place(window)
    window.installEventFilter(place)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
