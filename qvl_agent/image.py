"""Images as the model sees them: the `Screenshot`/`Region` value types, image-file decoding, the
content hash, and the one pair of functions that maps Qwen3-VL's 0-1000 grid to physical pixels.

A `Screenshot` carries raw pixel bytes (BGRA straight from mss, or RGB from a file), their size, where
the captured area sits in the virtual desktop (physical pixels) and the monitor's scale factor, so that
model coordinates can be mapped back to real pixels. Converting to PIL is slow (~50 ms for 1080p); the
engine takes the raw bytes instead. Live capture is `capture.py`'s job; this module never opens a display.

Coordinates: Qwen3-VL answers on a relative 0-1000 grid over the image it saw. We divide by 1000 (not
999): the grid is a fraction of the width, so `x/1000*width` lands on the pixel holding that fraction, and
the only point that falls outside, x = 1000 exactly, is clamped to the last pixel. Dividing by 999 would
shift every point right by up to one part in a thousand (2 px on a 1920 screen) for no gain. The
screenshot holds physical pixels and carries its offset in the virtual desktop, so the mapping is
`left + x/1000*width`; the scale factor never enters it (it matters only to code working in logical units,
such as Qt widgets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import xxhash

from qvl_agent.errors import CaptureError, ImageError, OffScreenError
from qvl_agent.image_limits import DECODE_BLOCK_BYTES, DECODE_BUDGET_S, OutOfTime, budgeted, check_jpeg, out_of_time

GRID = 1000  # Qwen3-VL's relative coordinate grid

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

    def scoped(self, scope: str) -> Screenshot:
        """The same pixels under a content hash of their own for `scope` (a server's user and cache salt):
        every cache keyed by the hash (vision features, pooled sessions) keeps scopes apart, so one user
        cannot learn from a cache hit that another sent the same image. The empty scope is this one."""
        if not scope:
            return self
        copy = dataclasses.replace(self)
        h = xxhash.xxh3_128()
        h.update(f"scope:{len(scope)}:{scope}:".encode("utf-8", "surrogatepass"))
        h.update(self.content_hash.encode())
        object.__setattr__(copy, "_content_hash", h.hexdigest())
        return copy

    def crop(self, region: Region) -> Screenshot:
        """The pixels of `region` (virtual-desktop pixels, inside this screenshot) as a screenshot of their
        own that knows where it lies: model points on the crop map straight to desktop pixels."""
        x0, y0 = region.left - self.left, region.top - self.top
        if x0 < 0 or y0 < 0 or x0 + region.width > self.width or y0 + region.height > self.height:
            raise ImageError(f"The crop {region} is not inside the {self.width}x{self.height} image at "
                             f"({self.left}, {self.top}).")  # fmt: skip
        bpp = len(self.layout)
        row, start, end = self.width * bpp, x0 * bpp, (x0 + region.width) * bpp
        data = b"".join(self.data[(y0 + y) * row + start : (y0 + y) * row + end] for y in range(region.height))
        return dataclasses.replace(
            self, data=data, width=region.width, height=region.height, left=region.left, top=region.top, monitor=None
        )

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


def load_image_bytes(
    data: bytes, max_pixels: int = DEFAULT_MAX_FILE_PIXELS, name: str = "image", budget_s: float = DECODE_BUDGET_S
) -> Screenshot:
    """The same checks as `load_image`, for bytes already in memory (HTTP uploads, page screenshots)."""
    if not data:
        raise ImageError(f"The {name} is empty (0 bytes).")
    return _decode(io.BytesIO(data), f"The {name}", max_pixels, source_name=name, budget_s=budget_s)


def _decode(
    source, subject: str, max_pixels: int, source_name: str, budget_s: float = DECODE_BUDGET_S, clock=time.monotonic
) -> Screenshot:
    """Decode `source` (a path or a file object) within `budget_s` seconds, refusing a JPEG built to be slow
    before decoding it (`image_limits`); every failure becomes one sentence about `subject`."""
    import warnings

    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            # Our own limit, said in one sentence, comes before Pillow's warning about bombs.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            if not hasattr(source, "read"):
                source = stack.enter_context(open(source, "rb"))
            data = source.read()
            check_jpeg(data, subject)  # before Pillow walks its segments one by one
            im = stack.enter_context(Image.open(budgeted(io.BytesIO(data), budget_s, clock)))
            # The header alone gives the size: refuse bombs before decoding a single pixel.
            w, h = im.size
            if w * h > max_pixels:
                raise ImageError(
                    f"{subject} is {w}x{h} = {w * h:,} pixels, over the limit of {max_pixels:,} pixels; "
                    "resize it or capture a region."
                )
            if im.format == "JPEG":
                check_jpeg(data, subject, w * h)  # a large image may have fewer scans
            im.decodermaxblock = DECODE_BLOCK_BYTES  # the budget is checked between blocks
            im.load()
            # A photo's EXIF orientation: the model sees it, and points land on it, the way viewers show
            # it (as transformers' own image loader does).
            return Screenshot.from_pil(ImageOps.exif_transpose(im), source=source_name)
    except ImageError:
        raise
    except OutOfTime:
        raise ImageError(out_of_time(subject, budget_s)) from None
    except UnidentifiedImageError:
        raise ImageError(f"{subject} is not an image that can be read (PNG, JPEG, WebP, BMP or GIF).") from None
    except Image.DecompressionBombError:
        raise ImageError(f"{subject} has too many pixels to decode safely (limit {max_pixels:,}).") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"{subject} is truncated or corrupt and cannot be decoded ({exc}).") from None


# --- coordinates: the model's 0-1000 grid <-> physical pixels -------------------------------


def to_pixels(x: float, y: float, shot: Screenshot) -> tuple[int, int]:
    """Model point (0-1000 over the screenshot) -> physical pixel of the virtual desktop.

    x = 1000 (the right edge) is clamped to the last pixel; anything outside 0-1000 raises OffScreenError.
    """
    for value, axis in ((x, "x"), (y, "y")):
        if not (isinstance(value, int | float) and math.isfinite(value)) or not 0 <= value <= GRID:
            raise OffScreenError(f"The point ({x:g}, {y:g}) is off the screen: {axis} must be between 0 and {GRID}.")
    px = min(math.floor(x * shot.width / GRID), shot.width - 1)
    py = min(math.floor(y * shot.height / GRID), shot.height - 1)
    return shot.left + px, shot.top + py


def zoom_region(x: float, y: float, shot: Screenshot, fraction: float) -> Region:
    """The crop of a zoom-in pass: `fraction` of each side of `shot`, centred on the model point (x, y)
    (0-1000) and shifted, not shrunk, to stay inside the screenshot; whole pixels, the edges rounded
    down as the published procedure does (ClawGUI-Eval's `_crop_and_zoom`, after the MAI-UI blog)."""
    w, h = shot.width * fraction, shot.height * fraction
    cx, cy = x / GRID * shot.width, y / GRID * shot.height
    left = min(max(cx - w / 2, 0.0), shot.width - w)
    top = min(max(cy - h / 2, 0.0), shot.height - h)
    x0, y0 = int(left), int(top)
    x1, y1 = min(int(left + w), shot.width), min(int(top + h), shot.height)
    return Region(shot.left + x0, shot.top + y0, max(x1 - x0, 1), max(y1 - y0, 1))


def to_model(px: float, py: float, shot: Screenshot) -> tuple[float, float]:
    """Physical pixel of the virtual desktop -> model point at that pixel's centre (inverse of
    `to_pixels`: `to_pixels(*to_model(p), shot) == p`). A pixel outside the screenshot raises
    OffScreenError."""
    if not shot.region.contains(px, py):
        raise OffScreenError(
            f"The pixel ({px}, {py}) is outside the captured area "
            f"{shot.width}x{shot.height} at ({shot.left}, {shot.top})."
        )
    return (
        (math.floor(px) - shot.left + 0.5) * GRID / shot.width,
        (math.floor(py) - shot.top + 0.5) * GRID / shot.height,
    )
