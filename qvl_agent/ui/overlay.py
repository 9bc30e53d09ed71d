"""Full-screen windows drawn over the desktop: the region picker and the click marker.

`RegionOverlay` shows the screenshot that was already taken (so nothing of ours is in it), dimmed, and
lets the person drag a rectangle; it reports the rectangle in physical pixels. Esc or a click without a
drag cancels. `ClickMarker` is a small always-on-top ring that ignores input, shown where the agent is
about to click, so the person sees the target before anything happens.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPen, QPixmap, QScreen
from PySide6.QtWidgets import QWidget

from qvl_agent.image import Region, Screenshot
from qvl_agent.ui.screen import to_logical, to_physical, to_qimage

MIN_REGION = 8  # physical pixels a side: anything smaller was a click, not a drag


class RegionOverlay(QWidget):
    """Drag a rectangle over a frozen screenshot of one monitor."""

    selected = Signal(object)  # Region in physical pixels of the virtual desktop
    cancelled = Signal()

    def __init__(self, shot: Screenshot, screen: QScreen) -> None:
        flags = Qt.WindowType.FramelessWindowHint | Qt.WindowType.WindowStaysOnTopHint | Qt.WindowType.Tool
        super().__init__(None, flags)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowTitle("qvl-agent region")
        self.setCursor(Qt.CursorShape.CrossCursor)
        self.shot, self._screen = shot, screen
        self.background = QPixmap.fromImage(to_qimage(shot))
        self._origin: QPoint | None = None
        self._current: QPoint | None = None
        self._done = False
        self.setGeometry(screen.geometry())

    def open(self) -> None:
        self.showFullScreen()
        self.activateWindow()
        self.raise_()

    def selection(self) -> QRect | None:
        """The dragged rectangle in widget coordinates (corner to corner, exclusive of the far edge)."""
        if self._origin is None or self._current is None:
            return None
        a, b = self._origin, self._current
        return QRect(min(a.x(), b.x()), min(a.y(), b.y()), abs(a.x() - b.x()), abs(a.y() - b.y()))

    def physical_region(self, rect: QRect) -> Region:
        """A widget rectangle (logical) → physical pixels of the virtual desktop."""
        x0, y0 = to_physical(self._screen, self.mapToGlobal(rect.topLeft()))
        x1, y1 = to_physical(self._screen, self.mapToGlobal(rect.topLeft() + QPoint(rect.width(), rect.height())))
        return Region(x0, y0, x1 - x0, y1 - y0)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        painter = QPainter(self)
        painter.drawPixmap(self.rect(), self.background)
        painter.fillRect(self.rect(), QColor(0, 0, 0, 110))
        rect = self.selection()
        if rect is not None:
            # The selection shows the screenshot undimmed, framed.
            ratio = self.background.width() / max(self.width(), 1)
            source = QRect(
                round(rect.x() * ratio), round(rect.y() * ratio), round(rect.width() * ratio),
                round(rect.height() * ratio),
            )  # fmt: skip
            painter.drawPixmap(rect, self.background, source)
            painter.setPen(QPen(QColor(255, 80, 40), 2))
            painter.drawRect(rect)
        painter.setPen(QColor(255, 255, 255))
        painter.drawText(
            self.rect().adjusted(0, 20, 0, 0), Qt.AlignmentFlag.AlignHCenter,
            "Drag over the part of the screen to ask about · Esc cancels",
        )  # fmt: skip

    def mousePressEvent(self, event) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            self._origin = self._current = event.position().toPoint()
            self.update()

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        if self._origin is not None:
            self._current = event.position().toPoint()
            self.update()

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        if event.button() != Qt.MouseButton.LeftButton or self._origin is None:
            return
        self._current = event.position().toPoint()
        rect = self.selection()
        region = self.physical_region(rect) if rect is not None else None
        self._done = True
        self.close()
        if region is None or region.width < MIN_REGION or region.height < MIN_REGION:
            self.cancelled.emit()
        else:
            self.selected.emit(region)

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_Escape:
            self.close()
        else:
            super().keyPressEvent(event)

    def closeEvent(self, event) -> None:  # noqa: N802
        if not self._done:
            self._done = True
            self.cancelled.emit()
        super().closeEvent(event)


class ClickMarker(QWidget):
    """A ring with a cross at a physical pixel, on top of everything and transparent to the pointer."""

    SIZE = 44

    def __init__(self) -> None:
        flags = (
            Qt.WindowType.FramelessWindowHint
            | Qt.WindowType.WindowStaysOnTopHint
            | Qt.WindowType.Tool
            | Qt.WindowType.WindowTransparentForInput
            | Qt.WindowType.X11BypassWindowManagerHint
        )
        super().__init__(None, flags)
        self.setAttribute(Qt.WidgetAttribute.WA_TranslucentBackground)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
        self.setWindowTitle("qvl-agent marker")
        self.setFixedSize(self.SIZE, self.SIZE)
        self.label = ""
        self.target: tuple[int, int] | None = None

    def show_at(self, x: int, y: int, label: str = "") -> None:
        """Centre the ring on physical pixel (x, y)."""
        screen = QGuiApplication.screenAt(QPoint(x, y)) or QGuiApplication.primaryScreen()
        centre = to_logical(screen, x, y)
        self.target, self.label = (x, y), label
        self.move(centre.x() - self.SIZE // 2, centre.y() - self.SIZE // 2)
        self.setToolTip(label)
        self.show()
        self.raise_()
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        c = self.SIZE // 2
        painter.setPen(QPen(QColor(255, 40, 40, 230), 4))
        painter.drawEllipse(QPoint(c, c), c - 4, c - 4)
        painter.setPen(QPen(QColor(255, 40, 40, 230), 2))
        painter.drawLine(c - 8, c, c + 8, c)
        painter.drawLine(c, c - 8, c, c + 8)
