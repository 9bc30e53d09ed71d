"""Where the pointer is, what to capture, and screenshots as Qt images.

Qt works in logical pixels; X11, mss and pyautogui in physical ones. Qt keeps each screen's top-left
corner in native coordinates and divides only the size by the device pixel ratio, so a logical point maps
to physical as `origin + (point - origin) * ratio`. Everything here hands back physical pixels.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QCursor, QGuiApplication, QImage, QScreen

from qvl_agent import capture
from qvl_agent.errors import CaptureError
from qvl_agent.image import Region, Screenshot


def screen_under_pointer() -> tuple[QScreen, QPoint]:
    pos = QCursor.pos()
    return (QGuiApplication.screenAt(pos) or QGuiApplication.primaryScreen()), pos


def to_physical(screen: QScreen, point: QPoint) -> tuple[int, int]:
    origin = screen.geometry().topLeft()
    ratio = screen.devicePixelRatio()
    return round(origin.x() + (point.x() - origin.x()) * ratio), round(origin.y() + (point.y() - origin.y()) * ratio)


def to_logical(screen: QScreen, x: float, y: float) -> QPoint:
    origin = screen.geometry().topLeft()
    ratio = screen.devicePixelRatio()
    return QPoint(round(origin.x() + (x - origin.x()) / ratio), round(origin.y() + (y - origin.y()) / ratio))


def grab_under_pointer() -> tuple[Screenshot, QScreen]:
    """The whole monitor under the pointer, grabbed before any window of ours is shown."""
    screen, pos = screen_under_pointer()
    px, py = to_physical(screen, pos)
    index = capture.monitor_at(px, py)
    return capture.grab(monitor=index, scale=screen.devicePixelRatio()), screen


def crop(shot: Screenshot, region: Region) -> Screenshot:
    """The part of `shot` inside `region` (physical pixels of the virtual desktop)."""
    left = max(region.left - shot.left, 0)
    top = max(region.top - shot.top, 0)
    right = min(region.left + region.width - shot.left, shot.width)
    bottom = min(region.top + region.height - shot.top, shot.height)
    if right - left < 1 or bottom - top < 1:
        raise CaptureError("The selected region lies outside the captured screen.")
    bpp = len(shot.layout)
    stride = shot.width * bpp
    rows = [shot.data[y * stride + left * bpp : y * stride + right * bpp] for y in range(top, bottom)]
    return Screenshot(
        b"".join(rows),
        right - left,
        bottom - top,
        shot.layout,
        left=shot.left + left,
        top=shot.top + top,
        scale=shot.scale,
        monitor=None,
        source=shot.source,
    )


def to_qimage(shot: Screenshot) -> QImage:
    """A deep copy as a QImage (mss leaves alpha at 0, so BGRA is read as RGB32, which ignores it)."""
    if shot.layout == "BGRA":
        image = QImage(shot.data, shot.width, shot.height, shot.width * 4, QImage.Format.Format_RGB32)
    else:
        image = QImage(shot.data, shot.width, shot.height, shot.width * 3, QImage.Format.Format_RGB888)
    return image.copy()


def logical_rect(screen: QScreen, region: Region) -> QRect:
    top_left = to_logical(screen, region.left, region.top)
    ratio = screen.devicePixelRatio()
    return QRect(top_left.x(), top_left.y(), round(region.width / ratio), round(region.height / ratio))


BROWSER_CLASSES = ("chromium", "chrome", "firefox", "brave", "microsoft-edge", "vivaldi", "opera", "epiphany")


def active_window_class() -> str:
    """WM_CLASS of the focused X11 window ("" when unknown or not on X11)."""
    try:
        from Xlib import X, display  # python-xlib, imported lazily like every display library

        d = display.Display()
        try:
            root = d.screen().root
            atom = d.intern_atom("_NET_ACTIVE_WINDOW")
            prop = root.get_full_property(atom, X.AnyPropertyType)
            if not prop or not prop.value or not prop.value[0]:
                return ""
            window = d.create_resource_object("window", prop.value[0])
            names = window.get_wm_class() or ()
            return " ".join(names)
        finally:
            d.close()
    except Exception:  # no X11, a window that vanished meanwhile: not knowing is fine here
        return ""


def browser_on_screen() -> bool:
    """Whether the focused window is a web browser (offers the Playwright script button)."""
    wm_class = active_window_class().lower()
    return any(name in wm_class for name in BROWSER_CLASSES)
