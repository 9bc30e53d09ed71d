"""The tray's question before an action runs in confirm mode: the model's reason, what will happen in words
(the same `confirm_question` as the terminal's `Do it?`), and three answers, as on the terminal:

* **Yes** does it;
* **No** does not, and the model is told the person declined (it tries something else);
* **Stop** ends the run. Closing the dialog (Esc, the window's close button) is Stop as well.

The marker ring shows the spot meanwhile (the caller draws it); the dialog keeps clear of it. The model's
words are shown as plain text, so nothing in them is read as markup.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from qvl_agent.act.describe import ConfirmQuestion

TITLE = "qvl-agent: allow this action?"
YES, NO, STOP = "yes", "no", "stop"
CLEARANCE = 60  # pixels kept between the dialog and the marked spot


def _label(text: str, wrap: bool = True) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(wrap)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class ConfirmDialog(QDialog):
    """Asks about one action; `answer` is YES, NO or STOP once it closes."""

    def __init__(self, question: ConfirmQuestion, spot: tuple[int, int] | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(TITLE)
        self.setWindowFlag(Qt.WindowType.WindowStaysOnTopHint, True)
        self.answer = STOP
        self.spot = spot
        layout = QVBoxLayout(self)
        if question.reason:
            layout.addWidget(_label("The model says:"))
            self.reason = _label(question.reason)
            self.reason.setIndent(12)
            layout.addWidget(self.reason)
        self.doing = _label(f"It will {question.doing}.")
        self.doing.setStyleSheet("font-weight: bold")
        layout.addWidget(self.doing)
        if question.warning:
            warning = _label(f"Warning: {question.warning}.")
            warning.setStyleSheet("color: #b00020")
            layout.addWidget(warning)
        if spot is not None:
            layout.addWidget(_label("The red ring marks the spot on the screen."))
        self.yes = QPushButton("&Yes, do it")
        self.no = QPushButton("&No, tell the model")
        self.stop = QPushButton("&Stop the run")
        self.yes.setToolTip("Carry out this action")
        self.no.setToolTip("Do not do it; the model is told and tries something else")
        self.stop.setToolTip("End the run here")
        buttons = QHBoxLayout()
        for button, answer in ((self.yes, YES), (self.no, NO), (self.stop, STOP)):
            button.setAutoDefault(False)
            button.clicked.connect(lambda _=False, a=answer: self._close_with(a))
            buttons.addWidget(button)
        layout.addLayout(buttons)
        self.setMinimumWidth(420)

    def _close_with(self, answer: str) -> None:
        self.answer = answer
        self.done(QDialog.DialogCode.Accepted if answer == YES else QDialog.DialogCode.Rejected)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().showEvent(event)
        self._keep_clear_of_the_spot()

    def _keep_clear_of_the_spot(self) -> None:
        """Centre the dialog on the screen of the spot, moved above or below it when it would cover it."""
        if self.spot is None:
            return
        point = QPoint(*self.spot)
        screen = QGuiApplication.screenAt(point) or QGuiApplication.primaryScreen()
        area = screen.availableGeometry()
        frame = self.frameGeometry()
        frame.moveCenter(area.center())
        if frame.adjusted(-CLEARANCE, -CLEARANCE, CLEARANCE, CLEARANCE).contains(point):
            below = point.y() + CLEARANCE
            if below + frame.height() <= area.bottom():
                frame.moveTop(below)
            else:
                frame.moveBottom(max(area.top() + frame.height(), point.y() - CLEARANCE))
        self.move(frame.topLeft())


def ask(question: ConfirmQuestion, spot: tuple[int, int] | None = None) -> str:
    """Show the dialog and wait for the person's answer: YES, NO or STOP."""
    dialog = ConfirmDialog(question, spot)
    dialog.exec()
    answer = dialog.answer
    dialog.deleteLater()
    return answer
