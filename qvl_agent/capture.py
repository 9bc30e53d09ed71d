"""Live screen capture: display detection (the one Wayland check), the monitor list and mss grabs.

Grabs come back as raw BGRA `Screenshot`s (see `image.py`); converting to PIL is slow (~50 ms for 1080p),
so nothing here does.

Platform specifics (display detection, mss, monitor lists) live here so the rest never branches on the OS.
"""

from __future__ import annotations

import os
import sys

from qvl_agent.errors import CaptureError
from qvl_agent.image import Region, Screenshot

# --- live capture -------------------------------------------------------------------------------------


def display_kind() -> str:
    """The display server, as capture and input see it: "x11", "xwayland" (a Wayland session with
    XWayland), "wayland" (without XWayland), "none" (Linux without a display) or "native" (Windows, macOS).
    The one place qvl-agent looks at DISPLAY and WAYLAND_DISPLAY."""
    if not sys.platform.startswith("linux"):
        return "native"
    wayland = bool(os.environ.get("WAYLAND_DISPLAY")) or os.environ.get("XDG_SESSION_TYPE") == "wayland"
    if os.environ.get("DISPLAY"):
        return "xwayland" if wayland else "x11"
    return "wayland" if wayland else "none"


def display_name() -> str:
    """What to call this display in a message, e.g. "X11 :0"."""
    kind = display_kind()
    return f"X11 {os.environ['DISPLAY']}" if kind in ("x11", "xwayland") else sys.platform


def display_problem() -> str | None:
    """Why screen capture cannot work here, as one sentence, or None when it can."""
    kind = display_kind()
    if kind == "wayland":
        return (
            "This is a Wayland session without XWayland: screen capture and input need XWayland "
            "(DISPLAY must be set); start an X11 session or enable XWayland."
        )
    if kind == "none":
        return "There is no display to capture: DISPLAY is not set (run inside a desktop session or start an X server)."
    return None


def _mss():
    problem = display_problem()
    if problem:
        raise CaptureError(problem)
    try:
        import mss

        return mss.MSS() if hasattr(mss, "MSS") else mss.mss()
    except Exception as exc:  # mss raises its own ScreenShotError or Xlib errors
        raise CaptureError(f"Cannot open the display for capture: {exc}.") from None


def list_monitors() -> list[Region]:
    """Every monitor, in mss order (index 1 is the first monitor; index 0 is the whole desktop)."""
    with _mss() as sct:
        return [Region(m["left"], m["top"], m["width"], m["height"]) for m in sct.monitors]


def monitor_at(x: int, y: int, monitors: list[Region] | None = None) -> int:
    """The index of the monitor holding the point (x, y); the first monitor when none does."""
    monitors = monitors if monitors is not None else list_monitors()
    for index, mon in enumerate(monitors[1:], start=1):
        if mon.contains(x, y):
            return index
    return 1


def grab(monitor: int | None = None, region: Region | None = None, scale: float = 1.0) -> Screenshot:
    """Capture a monitor (1-based, default the first) or a region of the virtual desktop as raw BGRA."""
    with _mss() as sct:
        monitors = sct.monitors
        if region is None:
            index = 1 if monitor is None else monitor
            if not 0 <= index < len(monitors):
                raise CaptureError(
                    f"There is no monitor {index}: this desktop has {len(monitors) - 1} "
                    f"(use {monitor_choices(len(monitors) - 1)}, or 0 for all of them)."
                )
            m = monitors[index]
            area = {"left": m["left"], "top": m["top"], "width": m["width"], "height": m["height"]}
        else:
            desktop = monitors[0]  # the union of all monitors; X11 answers a grab beyond it with a protocol error
            if not (
                region.left >= desktop["left"]
                and region.top >= desktop["top"]
                and region.left + region.width <= desktop["left"] + desktop["width"]
                and region.top + region.height <= desktop["top"] + desktop["height"]
            ):
                raise CaptureError(
                    f"The region {region.width}x{region.height} at ({region.left}, {region.top}) lies outside the "
                    f"screen, which is {desktop['width']}x{desktop['height']} at ({desktop['left']}, {desktop['top']})."
                )
            area = {"left": region.left, "top": region.top, "width": region.width, "height": region.height}
            index = None
        try:
            shot = sct.grab(area)
        except Exception as exc:
            raise CaptureError(f"Screen capture failed: {exc}.") from None
        return Screenshot(
            bytes(shot.bgra),
            shot.width,
            shot.height,
            "BGRA",
            left=area["left"],
            top=area["top"],
            scale=scale,
            monitor=index,
            source="screen",
        )


def monitor_choices(count: int) -> str:
    """The monitor numbers to offer: "1" for one monitor, "1 to 3" for three."""
    return "1" if count == 1 else f"1 to {count}"
