"""Screenshots: what the model sees, where it came from, and how to get one.

A `Screenshot` carries raw pixel bytes (BGRA straight from mss, or RGB from a file), their size, where
the captured area sits in the virtual desktop (physical pixels) and the monitor's scale factor, so that
model coordinates can be mapped back to real pixels. Converting to PIL is slow (~50 ms for 1080p); the
engine takes the raw bytes instead.

Platform specifics (display detection, mss, monitor lists) live here so the rest never branches on the OS.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import xxhash

from qvl_agent.errors import CaptureError, ImageError

Layout = Literal["BGRA", "RGB"]

# Qwen3-VL's processor refuses nothing, but a decompression bomb would exhaust memory long before that.
DEFAULT_MAX_FILE_PIXELS = 64_000_000


@dataclass(frozen=True)
class Region:
    """A rectangle in physical pixels of the virtual desktop."""

    left: int
    top: int
    width: int
    height: int

    @classmethod
    def parse(cls, text: str) -> Region:
        """Parse "X,Y,W,H" as given on the command line."""
        try:
            x, y, w, h = (int(part) for part in text.split(","))
        except ValueError:
            raise CaptureError(f"A region is X,Y,W,H in pixels, like 0,0,800,600, not {text!r}.") from None
        if w <= 0 or h <= 0:
            raise CaptureError(f"A region needs a positive width and height, not {text!r}.")
        return cls(x, y, w, h)

    def contains(self, x: float, y: float) -> bool:
        return self.left <= x < self.left + self.width and self.top <= y < self.top + self.height


@dataclass(frozen=True)
class Screenshot:
    """Raw pixels plus where they came from. `data` is `height * width * len(layout)` bytes, row-major."""

    data: bytes = field(repr=False)
    width: int
    height: int
    layout: Layout = "BGRA"
    left: int = 0  # offset of the captured area in the virtual desktop, physical pixels
    top: int = 0
    scale: float = 1.0  # physical pixels per logical pixel of the captured monitor (HiDPI)
    monitor: int | None = None  # mss monitor index, when a whole monitor was captured
    source: str = "screen"  # a file path, "screen", "array", ...

    def __post_init__(self) -> None:
        expected = self.width * self.height * len(self.layout)
        if self.width <= 0 or self.height <= 0 or len(self.data) != expected:
            raise ImageError(
                f"Image data of {len(self.data)} bytes does not match {self.width}x{self.height} {self.layout}."
            )

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    @property
    def region(self) -> Region:
        return Region(self.left, self.top, self.width, self.height)

    @property
    def content_hash(self) -> str:
        """A fast hash of exactly what the model will see: the pixels, their shape and layout."""
        cached = self.__dict__.get("_content_hash")
        if cached is None:
            # xxh3 reads a 1080p BGRA frame in under a millisecond; blake2b takes ~20 ms.
            h = xxhash.xxh3_128()
            h.update(f"{self.width}x{self.height}:{self.layout}:".encode())
            h.update(self.data)
            cached = h.hexdigest()
            object.__setattr__(self, "_content_hash", cached)
        return cached

    def to_pil(self):
        from PIL import Image

        if self.layout == "BGRA":
            return Image.frombuffer("RGBA", self.size, self.data, "raw", "BGRA", 0, 1).convert("RGB")
        return Image.frombuffer("RGB", self.size, self.data, "raw", "RGB", 0, 1)

    def to_png(self) -> bytes:
        buf = io.BytesIO()
        self.to_pil().save(buf, format="PNG", compress_level=1)
        return buf.getvalue()

    @classmethod
    def from_pil(cls, image, source: str = "pil") -> Screenshot:
        rgb = image.convert("RGB")
        return cls(rgb.tobytes(), rgb.width, rgb.height, "RGB", source=source)

    @classmethod
    def from_array(cls, array, layout: Layout = "RGB", source: str = "array") -> Screenshot:
        """From an `[H, W, 3]` RGB or `[H, W, 4]` BGRA uint8 array (numpy or anything with __array__)."""
        import numpy as np

        arr = np.ascontiguousarray(np.asarray(array, dtype=np.uint8))
        if arr.ndim != 3 or arr.shape[2] != len(layout):
            raise ImageError(f"Expected an [H, W, {len(layout)}] {layout} array, got shape {tuple(arr.shape)}.")
        return cls(arr.tobytes(), arr.shape[1], arr.shape[0], layout, source=source)


def load_image(path: str | os.PathLike, max_pixels: int = DEFAULT_MAX_FILE_PIXELS) -> Screenshot:
    """Read an image file into RGB pixels, refusing anything that is not a whole, sane image."""
    p = Path(path)
    if not p.exists():
        raise ImageError(f"No such image file: {p}.")
    if p.is_dir():
        raise ImageError(f"{p} is a folder, not an image file.")
    if p.stat().st_size == 0:
        raise ImageError(f"The image file {p} is empty (0 bytes).")
    return _decode(p, str(p), max_pixels, source_name=str(p))


def load_image_bytes(data: bytes, max_pixels: int = DEFAULT_MAX_FILE_PIXELS, name: str = "image") -> Screenshot:
    """The same checks as `load_image`, for bytes already in memory (HTTP uploads, page screenshots)."""
    if not data:
        raise ImageError(f"The {name} is empty (0 bytes).")
    return _decode(io.BytesIO(data), f"The {name}", max_pixels, source_name=name)


def _decode(source, subject: str, max_pixels: int, source_name: str) -> Screenshot:
    """Decode `source` (a path or a file object); every failure becomes one sentence about `subject`."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as im:
            # The header alone gives the size: refuse bombs before decoding a single pixel.
            w, h = im.size
            if w * h > max_pixels:
                raise ImageError(
                    f"{subject} is {w}x{h} = {w * h:,} pixels, over the limit of {max_pixels:,} pixels; "
                    "resize it or capture a region."
                )
            im.load()
            return Screenshot.from_pil(im, source=source_name)
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"{subject} is not an image that can be read (PNG, JPEG, WebP, BMP or GIF).") from None
    except Image.DecompressionBombError:
        raise ImageError(f"{subject} has too many pixels to decode safely (limit {max_pixels:,}).") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"{subject} is truncated or corrupt and cannot be decoded ({exc}).") from None


# --- live capture -------------------------------------------------------------------------------------


def display_problem() -> str | None:
    """Why screen capture cannot work here, as one sentence, or None when it can."""
    if sys.platform.startswith("linux"):
        if not os.environ.get("DISPLAY"):
            if os.environ.get("WAYLAND_DISPLAY") or os.environ.get("XDG_SESSION_TYPE") == "wayland":
                return (
                    "This is a Wayland session without XWayland: screen capture and input need XWayland "
                    "(DISPLAY must be set); start an X11 session or enable XWayland."
                )
            return "There is no display to capture: DISPLAY is not set (start an X server or use --image)."
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
                    f"(use 1 to {len(monitors) - 1}, or 0 for all of them)."
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
