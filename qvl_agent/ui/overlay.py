"""Full-screen windows drawn over the desktop: the region picker and the click marker.

`RegionOverlay` shows the screenshot that was already taken (so nothing of ours is in it), dimmed, and
lets the person drag a rectangle; it reports the rectangle in physical pixels. Esc or a click without a
drag cancels. `ClickMarker` is a small always-on-top ring that ignores input, shown where the agent is
about to click (so the person sees the target before anything happens) and where "Where is…?" found
something.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPen, QPixmap, QRegion, QScreen
from PySide6.QtWidgets import QWidget

from qvl_agent.image import Region, Screenshot
from qvl_agent.ui.screen import to_logical, to_physical, to_qimage

MIN_REGION = 8  # physical pixels a side: anything smaller was a click, not a drag
MARKER_COLOR = QColor(230, 30, 30)


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
    """A ring with four ticks around a physical pixel, on top of everything and transparent to the pointer.

    The window is shaped with a mask, so only the ring and ticks are drawn and the target in the middle
    stays visible on every desktop: without a compositor a translucent window would be an opaque square.
    """

    SIZE = 48
    RING = 5  # ring thickness
    CLEAR = 8  # radius around the target that nothing covers

    def __init__(self) -> None:
        flags = (
            Qt.WindowType.FramelessWindowHint
            | Qt.WindowType.WindowStaysOnTopHint
            | Qt.WindowType.Tool
            | Qt.WindowType.WindowTransparentForInput
            | Qt.WindowType.X11BypassWindowManagerHint
        )
        super().__init__(None, flags)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
        self.setWindowTitle("qvl-agent marker")
        self.setFixedSize(self.SIZE, self.SIZE)
        self.setMask(self.shape())
        self.label = ""
        self.target: tuple[int, int] | None = None

    @classmethod
    def shape(cls) -> QRegion:
        """The ring and the ticks pointing at the centre; the centre itself is left out."""
        size, c = cls.SIZE, cls.SIZE // 2
        inner = cls.SIZE - 2 * cls.RING
        region = QRegion(0, 0, size, size, QRegion.RegionType.Ellipse)
        region -= QRegion(cls.RING, cls.RING, inner, inner, QRegion.RegionType.Ellipse)
        tick = c - cls.RING - cls.CLEAR
        for rect in (
            QRect(c - 1, cls.RING, 3, tick), QRect(c - 1, c + cls.CLEAR, 3, tick),
            QRect(cls.RING, c - 1, tick, 3), QRect(c + cls.CLEAR, c - 1, tick, 3),
        ):  # fmt: skip
            region += QRegion(rect)
        return region

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
        painter.fillRect(self.rect(), MARKER_COLOR)  # the mask cuts out the ring and ticks
        painter.setPen(QPen(QColor(255, 255, 255), 1))  # a light inner edge, seen on red backgrounds too
        painter.drawEllipse(self.RING, self.RING, self.SIZE - 2 * self.RING - 1, self.SIZE - 2 * self.RING - 1)
