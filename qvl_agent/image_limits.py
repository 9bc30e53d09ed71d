"""What makes an image file too costly to decode, found before a pixel is decoded, and a time budget for
the rest.

Decoding time is not bounded by the pixel count alone. Each scan of a progressive JPEG is a pass over every
block of the image: a 266 KB file of 20,000 tiny scans decoded for 38 s. Header parsers walk segments or
chunks one at a time in Python: a megabyte of empty JPEG comments or PNG ancillary chunks takes Pillow
about 2 s just to open. So:

- `jpeg_layout` counts a JPEG's scans and segments from its markers, with the entropy-coded data searched
  in C; `check_jpeg` refuses more scans than `max_jpeg_scans(pixels)` (100, fewer for very large images:
  the cost is scans x pixels) or more than MAX_JPEG_SEGMENTS segments, each with one sentence.
- `budgeted` wraps the file Pillow reads from: Pillow feeds its parsers and decoders from `read`, block by
  block, so once the budget is spent the next read ends the work (`OutOfTime`). The budget covers opening
  and decoding; its granularity is one block (4 KB while decoding).

This module knows nothing about where the bytes came from (a file, an HTTP body); `image.py` and
`server/images.py` word the errors for their callers.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable

from qvl_agent.errors import ImageError

MAX_JPEG_SCANS = 100  # a progressive photo has about 10 (libjpeg's simple progression: 10)
JPEG_SCAN_PIXELS = 400_000_000  # scans x pixels: 100 scans up to 4 megapixels, 23 at Qwen3-VL's 16.7
MIN_JPEG_SCANS = 16  # never fewer than this allowed, whatever the size
MAX_JPEG_SEGMENTS = 1_000  # markers of any kind: a real file has a few dozen (two tables per scan at most)
DECODE_BUDGET_S = 10.0  # a 16-megapixel PNG opens and decodes in well under a second
DECODE_BLOCK_BYTES = 4096  # what Pillow reads between two budget checks while decoding

_ANY_MARKER = re.compile(rb"\xff[^\x00\xff]")  # skips junk and fill bytes as libjpeg does
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # ends entropy-coded data: not stuffing, not RSTn


def jpeg_layout(data: bytes | memoryview, max_scans: int = MAX_JPEG_SCANS) -> tuple[int, int]:
    """(scans, segments) of a JPEG, from its markers alone; (0, 0) for data that is not a JPEG. Counting
    stops once scans pass `max_scans` or segments pass MAX_JPEG_SEGMENTS, so the walk is short whatever the
    file. Segments are skipped by their length, so a thumbnail inside EXIF is not counted."""
    if bytes(data[:2]) != b"\xff\xd8":
        return 0, 0
    scans = segments = 0
    pos, size = 2, len(data)
    while scans <= max_scans and segments <= MAX_JPEG_SEGMENTS:
        found = _ANY_MARKER.search(data, pos)
        if found is None:
            break
        marker, pos = data[found.start() + 1], found.end()
        segments += 1
        if marker == 0xD9:  # end of image
            break
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            continue
        if pos + 2 > size:
            break
        pos += int.from_bytes(bytes(data[pos : pos + 2]), "big")
        if marker == 0xDA:  # start of scan: its entropy-coded data runs up to the next real marker
            scans += 1
            found = _NEXT_MARKER.search(data, pos)
            if found is None:
                break
            pos = found.start()
    return scans, segments


def max_jpeg_scans(pixels: int) -> int:
    """The scans a JPEG of `pixels` may have: decoding costs a pass over the image per scan."""
    return max(MIN_JPEG_SCANS, min(MAX_JPEG_SCANS, JPEG_SCAN_PIXELS // max(pixels, 1)))


def check_jpeg(data: bytes | memoryview, subject: str, pixels: int = 0) -> None:
    """ImageError (one sentence about `subject`) for a JPEG whose scans or segments would make decoding
    slow; nothing for any other data. `pixels` from the header when known (0: the most lenient bound)."""
    allowed = max_jpeg_scans(pixels)
    scans, segments = jpeg_layout(data, allowed)
    if scans > allowed:
        raise ImageError(
            f"{subject} is a progressive JPEG of more than {allowed} scans (a photo has about 10, and each "
            "scan is a pass over the whole image), so it is not decoded; save it as PNG or as a baseline JPEG."
        )
    if segments > MAX_JPEG_SEGMENTS:
        raise ImageError(
            f"{subject} is a JPEG of more than {MAX_JPEG_SEGMENTS:,} segments (a photo has a few dozen), so it "
            "is not decoded; save it again with an image editor."
        )


class OutOfTime(Exception):
    """The decode budget ran out; raised from inside Pillow's read loop."""


class _Budgeted(io.RawIOBase):
    def __init__(self, inner, deadline: float, clock: Callable[[], float]):
        self.inner, self.deadline, self.clock = inner, deadline, clock

    def read(self, n: int = -1) -> bytes:
        if self.clock() > self.deadline:
            raise OutOfTime
        return self.inner.read(n)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()


def budgeted(inner, budget_s: float, clock: Callable[[], float] = time.monotonic) -> io.RawIOBase:
    """A file over `inner` whose reads raise OutOfTime once `budget_s` seconds have passed from now."""
    return _Budgeted(inner, clock() + budget_s, clock)


def out_of_time(subject: str, budget_s: float) -> str:
    return (
        f"{subject} took more than {budget_s:g} s to open and decode and was given up; save it as PNG or "
        "as a baseline JPEG."
    )
