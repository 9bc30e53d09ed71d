"""The app icon, and the small always-on-top launcher shown where the desktop has no system tray."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QAction, QColor, QFont, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLayout, QPushButton, QVBoxLayout, QWidget

LAUNCHER_TITLE = "qvl-agent launcher"


def make_icon() -> QIcon:
    """A drawn icon, so the app ships no image files."""
    icon = QIcon()
    for size in (16, 22, 24, 32, 48, 64):
        pixmap = QPixmap(size, size)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setBrush(QColor(40, 110, 220))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.drawRoundedRect(QRectF(0, 0, size, size), size * 0.22, size * 0.22)
        painter.setPen(QColor(255, 255, 255))
        font = QFont()
        font.setBold(True)
        font.setPixelSize(int(size * 0.7))
        painter.setFont(font)
        painter.drawText(QRectF(0, 0, size, size), Qt.AlignmentFlag.AlignCenter, "Q")
        painter.end()
        icon.addPixmap(pixmap)
    return icon


class Launcher(QWidget):
    """Stands in for the tray icon: the same actions as buttons, plus the engine's status.

    The window takes the size of its contents and grows with a longer status, so no text is cut off.
    """

    def __init__(self, actions: list[QAction], notice: str) -> None:
        flags = Qt.WindowType.Window | Qt.WindowType.WindowStaysOnTopHint | Qt.WindowType.Tool
        super().__init__(None, flags)
        self.setWindowTitle(LAUNCHER_TITLE)
        self.setWindowIcon(make_icon())
        self.notice = QLabel(notice)
        self.notice.setWordWrap(True)
        self.status = QLabel("Loading the model…")
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        for action in actions:
            button = QPushButton(action.text())
            button.setToolTip(action.toolTip())
            button.clicked.connect(action.trigger)
            row.addWidget(button)
        layout = QVBoxLayout(self)
        # Word-wrapped labels in a freely sized window get clipped; a fixed-size layout asks each its height.
        layout.setSizeConstraint(QLayout.SizeConstraint.SetFixedSize)
        layout.addWidget(self.notice)
        layout.addWidget(self.status)
        layout.addLayout(row)

    def set_status(self, text: str) -> None:
        self.status.setText(text)
