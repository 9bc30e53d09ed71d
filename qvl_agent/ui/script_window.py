"""Where a saved Playwright script goes on the screen: an editor when one opens, else a window of ours.

`open_in_editor` hands the file to the desktop (`xdg-open` on Linux, run here so its complaints are kept
off the terminal and its exit status is seen; the desktop's own opener elsewhere) and calls `on_failure`
when nothing could open it. `ScriptWindow` then shows the script itself, read-only, with **Copy** (to the
clipboard) and **Save as…** (a private copy where the person chooses), and the command that replays it.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, Qt, QUrl
from PySide6.QtGui import QDesktopServices, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

TITLE = "qvl-agent: Playwright script"


def open_in_editor(path: Path, on_failure: Callable[[], None], parent: QObject | None = None) -> None:
    """Open `path` with the desktop's editor for it; `on_failure()` (on the GUI thread) when none opens."""
    if not sys.platform.startswith("linux"):
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            on_failure()
        return
    opener = shutil.which("xdg-open")
    if opener is None:
        on_failure()
        return
    process = QProcess(parent)
    process.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)  # read, never on our stderr
    failed = []

    def fail() -> None:
        if not failed:
            failed.append(True)
            on_failure()

    def finished(code: int, status: QProcess.ExitStatus) -> None:
        process.readAll()
        if code != 0 or status != QProcess.ExitStatus.NormalExit:
            fail()
        process.deleteLater()

    def error(problem: QProcess.ProcessError) -> None:
        if problem == QProcess.ProcessError.FailedToStart:
            fail()
            process.deleteLater()

    process.readyRead.connect(process.readAll)  # xdg-open's complaints: drained, not shown twice
    process.finished.connect(finished)
    process.errorOccurred.connect(error)
    process.start(opener, [str(path)])


class ScriptWindow(QDialog):
    """The script, read-only, with Copy and Save as…, for when no editor could be opened."""

    def __init__(self, path: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = path
        self.setWindowTitle(TITLE)
        self.setWindowFlag(Qt.WindowType.WindowStaysOnTopHint, True)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        self.text = path.read_text(encoding="utf-8")
        intro = QLabel(
            f"No editor could be opened for the script, so here it is. It is saved as {path}; "
            f"run it with: qvl-agent replay {path}"
        )
        intro.setTextFormat(Qt.TextFormat.PlainText)
        intro.setWordWrap(True)
        intro.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.view = QPlainTextEdit(self.text)
        self.view.setReadOnly(True)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.status = QLabel("")
        self.copy_button = QPushButton("&Copy")
        self.save_button = QPushButton("Save &as…")
        self.close_button = QPushButton("Close")
        self.copy_button.clicked.connect(self.copy)
        self.save_button.clicked.connect(self.save_as)
        self.close_button.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        for button in (self.copy_button, self.save_button, self.close_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.view, 1)
        layout.addLayout(buttons)
        self.resize(760, 520)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self.status.setText("Script copied.")

    def save_as(self) -> None:
        dialog = QFileDialog(self, "Save the script as", str(self.path))
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog, True)  # the same dialog on every desktop
        dialog.setNameFilter("Python scripts (*.py)")
        if not dialog.exec() or not dialog.selectedFiles():
            return
        target = Path(dialog.selectedFiles()[0])
        try:
            target.write_text(self.text, encoding="utf-8")
            target.chmod(0o600)  # as private as the script it copies
        except OSError as exc:
            self.status.setText(f"Not saved: {exc.strerror or exc}.")
            return
        self.status.setText(f"Saved as {target}.")
