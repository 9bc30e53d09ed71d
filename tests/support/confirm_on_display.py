"""The tray's automation in confirm mode on a real X display (Qt's xcb platform), as its own process:
`python -m tests.support.confirm_on_display OUT_DIR REPLIES_JSON [--mode=MODE] ANSWER...`.

The run is the real `Automation` with the replay engine and a recording executor (nothing moves on the
display). Each time the confirm dialog is up, the whole screen is grabbed from the X server
(`ask-N.png`) and what a person would see is written down: the dialog's frame, each button's text,
visibility and place on the screen, the dialog's texts, the marker ring's place; then the button named by
the next ANSWER (yes, no or stop) is clicked. The run starts from an ask window's Do it, in the safety
mode MODE (default confirm); once it ended and the window is back, the screen is grabbed again
(`after.png`) with the window's frame and its status line. Prints one JSON object: {"asked": [...],
"finished": the sentence the run ended with, "executed": [action kinds], "window": {...}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PySide6.QtCore import QRect, QTimer
from PySide6.QtWidgets import QApplication, QLabel
from shiboken6 import isValid

from qvl_agent.config import Settings
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from tests.support.recording import RecordingExecutor


def _rect(rect: QRect) -> list[int]:
    return [rect.x(), rect.y(), rect.width(), rect.height()]


def main(out: Path, replies: list[str], answers: list[str], mode: str = "confirm") -> None:
    from qvl_agent.ui.ask_window import AskWindow
    from qvl_agent.ui.automation import Automation
    from qvl_agent.ui.confirm_dialog import ConfirmDialog
    from qvl_agent.ui.engine_worker import EngineHost

    app = QApplication(["confirm-on-display"])
    app.setQuitOnLastWindowClosed(False)  # as the tray app: the dialog closing is not the end
    screen = app.primaryScreen().geometry()
    width, height = screen.width(), screen.height()
    shot = Screenshot(b"\x80\x80\x80\x00" * width * height, width, height, "BGRA", source="test")
    executors: list[RecordingExecutor] = []

    def executor_factory(s, guard, mode):
        from qvl_agent.act.dry_run import DryRunExecutor

        executors.append(RecordingExecutor([shot]))  # the desktop, as the tray's default_executor wraps it
        return DryRunExecutor(executors[-1]) if mode == "dry-run" else executors[-1]

    host = EngineHost()
    automation = Automation(
        host, lambda: Settings(safety_mode=mode), executor_factory=executor_factory, trace_root=out / "runs"
    )
    window = AskWindow(host, shot)
    window.show()
    report: dict = {"asked": [], "finished": None, "executed": []}

    def look() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, ConfirmDialog) or not dialog.isVisible():
            QTimer.singleShot(50, look)
            return
        QTimer.singleShot(400, lambda: record(dialog))  # mapped and painted by the X server by then

    def record(dialog: ConfirmDialog) -> None:
        n = len(report["asked"]) + 1
        app.primaryScreen().grabWindow(0).save(str(out / f"ask-{n}.png"))
        buttons = {}
        for name in ("yes", "no", "stop"):
            button = getattr(dialog, name)
            top_left = button.mapToGlobal(button.rect().topLeft())
            buttons[name] = {
                "text": button.text(),
                "visible": button.isVisible(),
                "rect": [top_left.x(), top_left.y(), button.width(), button.height()],
            }
        marker = automation.marker
        report["asked"].append({
            "title": dialog.windowTitle(),
            "frame": _rect(dialog.frameGeometry()),
            "screen": [0, 0, width, height],
            "texts": [label.text() for label in dialog.findChildren(QLabel)],
            "buttons": buttons,
            "marker": _rect(marker.geometry()) if marker.isVisible() else None,
        })  # fmt: skip
        getattr(dialog, answers[n - 1]).click()
        QTimer.singleShot(50, look)

    def finished(text: str) -> None:
        report["finished"] = text
        report["executed"] = [a.kind for e in executors for a in e.actions]
        QTimer.singleShot(100, after)

    def after(tries: int = 200) -> None:
        # The screen once the status line is painted on it (a busy machine paints late), else after 20 s
        # the screen as it is, for the test to judge.
        status = window.status
        top_left = status.mapToGlobal(status.rect().topLeft())
        screen = app.primaryScreen().grabWindow(0)
        band = screen.copy(top_left.x(), top_left.y(), max(1, status.width() // 2), max(1, status.height())).toImage()
        colours = {band.pixel(x, y) for x in range(band.width()) for y in range(band.height())}
        if len(colours) <= 2 and tries > 0:
            QTimer.singleShot(100, lambda: after(tries - 1))
            return
        screen.save(str(out / "after.png"))
        report["window"] = {
            "visible": window.isVisible(),
            "frame": _rect(window.frameGeometry()),
            "status": status.text(),
            "status_rect": [top_left.x(), top_left.y(), status.width(), status.height()],
        }
        app.quit()

    automation.finished.connect(finished)
    host.ready.connect(lambda *_: automation.do_it("Place the order", shot, window))
    host.load(lambda: ReplayEngine(replies))
    QTimer.singleShot(50, look)
    QTimer.singleShot(60_000, app.quit)  # a dialog that never came: the report says so
    app.exec()
    automation.marker.close()
    if isValid(window):
        window.close()
    host.close()
    print(json.dumps(report))


if __name__ == "__main__":
    modes = [a.removeprefix("--mode=") for a in sys.argv[3:] if a.startswith("--mode=")]
    answers = [a for a in sys.argv[3:] if not a.startswith("--mode=")]
    main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text(encoding="utf-8")), answers, *modes)
