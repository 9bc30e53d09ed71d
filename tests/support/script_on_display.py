"""The tray's Playwright-script hand-off on a real X display (Qt's xcb platform), as its own process:
`python -m tests.support.script_on_display OUT_DIR SCRIPT`.

A script that passed its checks reaches `ScriptFlow` as the engine thread hands it over, and the flow
opens it the way the tray does (`xdg-open` from PATH). When a window titled like the script window shows
up, the whole screen is grabbed from the X server (`shown.png`) and what a person would see is written
down (the window's frame, its text, its buttons); then Copy is pressed and the clipboard read, and
Save as… is pressed and the file dialog given OUT_DIR/copy.py. Prints one JSON object; when no window
came within a few seconds of the hand-off, "window" is null.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PySide6.QtCore import QRect, QTimer
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QLineEdit


def _rect(rect: QRect) -> list[int]:
    return [rect.x(), rect.y(), rect.width(), rect.height()]


def main(out: Path, script: Path) -> None:
    from qvl_agent.config import Settings
    from qvl_agent.ui.engine_worker import EngineHost
    from qvl_agent.ui.script_flow import ScriptFlow
    from qvl_agent.ui.script_window import ScriptWindow

    app = QApplication(["script-on-display"])
    app.setQuitOnLastWindowClosed(False)
    screen = app.primaryScreen().geometry()
    host = EngineHost()
    flow = ScriptFlow(host, lambda: Settings(), script_dir=out)
    report: dict = {"window": None, "finished": []}
    flow.finished.connect(report["finished"].append)
    # An editor that opened leaves no window of ours: give a failing opener a few seconds, then end.
    flow.finished.connect(lambda _: QTimer.singleShot(4000, lambda: report["window"] or app.quit()))

    def look() -> None:
        windows = [w for w in app.topLevelWidgets() if isinstance(w, ScriptWindow) and w.isVisible()]
        if not windows:
            QTimer.singleShot(50, look)
            return
        QTimer.singleShot(500, lambda: record(windows[0]))

    def record(window: ScriptWindow) -> None:
        app.primaryScreen().grabWindow(0).save(str(out / "shown.png"))
        buttons = {}
        for name in ("copy_button", "save_button", "close_button"):
            button = getattr(window, name)
            top_left = button.mapToGlobal(button.rect().topLeft())
            buttons[name] = {
                "text": button.text(),
                "visible": button.isVisible(),
                "rect": [top_left.x(), top_left.y(), button.width(), button.height()],
            }
        view = window.view
        top_left = view.mapToGlobal(view.rect().topLeft())
        report["window"] = {
            "title": window.windowTitle(),
            "frame": _rect(window.frameGeometry()),
            "screen": _rect(screen),
            "shown_text": view.toPlainText(),
            "view": [top_left.x(), top_left.y(), view.width(), view.height()],
            "labels": [label.text() for label in window.findChildren(QLabel)],
            "buttons": buttons,
        }
        window.copy_button.click()
        report["clipboard"] = app.clipboard().text()
        QTimer.singleShot(100, lambda: answer_save_dialog(window))
        window.save_button.click()  # modal: returns once the file dialog is answered
        report["status"] = window.status.text()
        app.quit()

    def answer_save_dialog(window: ScriptWindow) -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):
            QTimer.singleShot(50, lambda: answer_save_dialog(window))
            return
        dialog.findChild(QLineEdit, "fileNameEdit").setText(str(out / "copy.py"))  # typed, as a person does
        dialog.accept()

    QTimer.singleShot(0, lambda: flow._got_script((script, "attempt 1: passed"), None))
    QTimer.singleShot(50, look)
    QTimer.singleShot(30_000, app.quit)
    app.exec()
    host.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
