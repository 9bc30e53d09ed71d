"""A small PySide6 form for end-to-end tests of the desktop agent.

    python -m tests.apps.form_app GEOMETRY.json STATE.json

Shows two text fields, a checkbox and two buttons, well away from the screen edges. Once the window is
mapped and has stopped moving (the window manager may place it), it writes every widget's real global
geometry in physical pixels to GEOMETRY.json. After every change it rewrites STATE.json (atomically) with
what the fields hold, whether the box is ticked, what the buttons received and how many wheel turns and
button presses reached any of its widgets, so a test can tell that every click and keystroke landed, and
that nothing else did. It exits on SIGTERM or when the Quit button is clicked.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QPoint, QTimer
from PySide6.QtGui import QWindow
from PySide6.QtWidgets import QApplication, QCheckBox, QFormLayout, QLineEdit, QPushButton, QWidget


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


class Form(QWidget):
    def __init__(self, geometry_path: Path, state_path: Path):
        super().__init__()
        self.geometry_path, self.state_path = geometry_path, state_path
        self.setWindowTitle("qvl-agent test form")
        self.name = QLineEdit(objectName="name")
        self.email = QLineEdit(objectName="email")
        self.agree = QCheckBox("I agree", objectName="agree")
        self.submit = QPushButton("Submit", objectName="submit")
        self.quit = QPushButton("Quit", objectName="quit")
        self.submitted: list[dict] = []
        layout = QFormLayout(self)
        layout.setVerticalSpacing(24)
        layout.addRow("Name", self.name)
        layout.addRow("Email", self.email)
        layout.addRow("", self.agree)
        layout.addRow("", self.submit)
        layout.addRow("", self.quit)
        for w in (self.name, self.email):
            w.setMinimumWidth(320)
            w.textChanged.connect(self.save_state)
        self.agree.toggled.connect(self.save_state)
        self.submit.clicked.connect(self.on_submit)
        self.quit.clicked.connect(QApplication.quit)
        self.setGeometry(400, 250, 640, 380)
        self._last_pos = None
        self._poll = QTimer(self, interval=100, timeout=self.report_geometry)
        self.pointer_events = {"wheel": 0, "press": 0}

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        kind = {QEvent.Type.Wheel: "wheel", QEvent.Type.MouseButtonPress: "press"}.get(event.type())
        if kind and isinstance(watched, QWindow):
            self.pointer_events[kind] += 1  # each event from X reaches the window once, before any widget
            self.save_state()
        return False

    def on_submit(self) -> None:
        self.submitted.append({"name": self.name.text(), "email": self.email.text(), "agree": self.agree.isChecked()})
        self.save_state()

    def state(self) -> dict:
        return {
            "name": self.name.text(),
            "email": self.email.text(),
            "agree": self.agree.isChecked(),
            "submitted": self.submitted,
            "pointer_events": self.pointer_events,
        }

    def save_state(self) -> None:
        _write(self.state_path, self.state())

    def widgets(self) -> dict:
        ratio = self.devicePixelRatioF()  # Qt geometry is logical; X11, mss and pyautogui are physical
        out = {}
        for w in (self.name, self.email, self.agree, self.submit, self.quit):
            top_left = w.mapToGlobal(QPoint(0, 0))
            out[w.objectName()] = [
                round(top_left.x() * ratio),
                round(top_left.y() * ratio),
                round(w.width() * ratio),
                round(w.height() * ratio),
            ]
        return out

    def report_geometry(self) -> None:
        handle = self.windowHandle()
        if handle is None or not handle.isExposed():
            return
        widgets = self.widgets()
        if widgets == self._last_pos:  # unchanged for one poll: the window manager is done placing it
            self._poll.stop()
            _write(self.geometry_path, {"widgets": widgets, "pid": os.getpid()})
        self._last_pos = widgets


def main() -> int:
    app = QApplication(sys.argv[:1])
    form = Form(Path(sys.argv[1]), Path(sys.argv[2]))
    app.installEventFilter(form)
    form.save_state()
    form.show()
    form.raise_()
    form.activateWindow()
    form._poll.start()
    signal.signal(signal.SIGTERM, lambda *_: app.quit())
    # Let Python see SIGTERM while Qt's event loop runs.
    tick = QTimer(interval=100, timeout=lambda: None)
    tick.start()
    code = app.exec()
    form.save_state()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
