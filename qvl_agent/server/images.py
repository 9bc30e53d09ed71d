"""Image parts into Screenshots, after the request was admitted and within its budget.

`ImageDecoder.probe(chat)` reads every `ImageRef` of a request: base64 `data:` URLs (PNG, JPEG, WebP), or
http(s) URLs through a `fetch.ImageFetcher` when the server allows them, and checks what the headers say
without decoding a pixel: at most `max_images` images and `max_total_pixels` pixels in all (413
otherwise), and a JPEG of no more scans than `image.max_jpeg_scans` allows (400: each scan of a
progressive JPEG is a pass over the whole image, and 20,000 tiny ones decoded for 38 s). The caller counts
the prompt's tokens from those header sizes (`budget.check_prompt_tokens`), and only then
`ImageDecoder.decode` decodes, each image within `decode_budget_s`. A small LRU keeps recent decodes, so
a stateless client that re-sends the same screenshot with every follow-up pays for the decode once.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass

from qvl_agent.errors import ImageError
from qvl_agent.image import Screenshot, load_image_bytes
from qvl_agent.image_limits import DECODE_BUDGET_S, OutOfTime, budgeted, check_jpeg, out_of_time
from qvl_agent.server.fetch import ImageFetcher
from qvl_agent.server.protocol import ApiError, ChatRequest, HistoryTurn, ImageRef

IMAGE_MIME_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/webp"}
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")


@dataclass(frozen=True)
class ImageBudget:
    """What one request may ask the server to decode."""

    max_pixels: int  # per image
    max_images: int = 16
    max_total_pixels: int = 40_000_000  # about twenty 1080p screenshots
    decode_budget_s: float = DECODE_BUDGET_S  # per image; a decode past it is given up (400)


@dataclass(frozen=True)
class Probed:
    """One image of a request as its header describes it, not yet decoded."""

    data: bytes
    name: str
    width: int = 0  # 0 when the header could not be read: the decode then words the error
    height: int = 0


class ImageDecoder:
    def __init__(self, budget: ImageBudget, fetcher: ImageFetcher | None = None, cache_entries: int = 16):
        self.budget = budget
        self.fetcher = fetcher
        self._cache: OrderedDict[str, Screenshot] = OrderedDict()
        self._entries = cache_entries
        self._lock = threading.Lock()

    def resolve(self, chat: ChatRequest) -> ChatRequest:
        """The same request with every image decoded, or ApiError (400 bad image, 413 over budget)."""
        return self.decode(chat, self.probe(chat))

    def probe(self, chat: ChatRequest) -> dict[ImageRef, Probed]:
        """Every image's bytes and header size, checked against the budget before anything is decoded."""
        refs = chat.image_refs()
        if len(refs) > self.budget.max_images:
            raise ApiError(
                413,
                f"The request carries {len(refs)} images; this server takes at most {self.budget.max_images} "
                "per request.",
                param="messages",
                code="too_many_images",
            )
        probed: dict[ImageRef, Probed] = {}
        total = 0
        for ref in refs:
            if ref not in probed:
                data, name = self._bytes(ref)
                probed[ref] = self._check_header(data, ref, name, total)
                total += probed[ref].width * probed[ref].height
        return probed

    def decode(self, chat: ChatRequest, probed: dict[ImageRef, Probed]) -> ChatRequest:
        """The request with every probed image decoded (400 when one cannot be)."""
        decoded = {ref: self._decode(p.data, ref, p.name) for ref, p in probed.items()}

        def swap(images):
            return tuple(decoded[im] if isinstance(im, ImageRef) else im for im in images)

        history = [HistoryTurn(t.text, swap(t.images), t.reply) for t in chat.history]
        return dataclasses.replace(chat, history=history, images=swap(chat.images))

    def _bytes(self, ref: ImageRef) -> tuple[bytes, str]:
        url = ref.url
        if url.startswith(("http://", "https://")):
            if self.fetcher is None:
                raise ApiError(
                    400,
                    "Image URLs are not fetched by this server; send the image as a base64 "
                    "data: URL (start the server with --allow-image-urls to allow them).",
                    param=ref.param,
                    code="image_url_not_allowed",
                )
            return self.fetcher.fetch(url, ref.param), "image at that URL"
        header, sep, payload = url.partition(",")
        if not url.startswith("data:") or not sep or ";base64" not in header.lower():
            raise ApiError(
                400,
                "An image_url must be a base64 data: URL (data:image/png;base64,...).",
                param=ref.param,
                code="invalid_image_url",
            )
        mime = header[5:].split(";")[0].strip().lower()
        if mime not in IMAGE_MIME_TYPES:
            raise ApiError(
                400,
                f"Images must be PNG, JPEG or WebP, not {mime[:40] or 'an unnamed type'}.",
                param=ref.param,
                code="invalid_image_format",
            )
        try:
            return base64.b64decode(payload.strip(), validate=True), "image"
        except (binascii.Error, ValueError):
            raise ApiError(400, "The image data is not valid base64.", param=ref.param, code="invalid_base64") from None

    def _check_header(self, data: bytes, ref: ImageRef, name: str, spent: int) -> Probed:
        """The image's size, read from its header only; 413 past either pixel limit, 400 for a JPEG of
        too many scans (counted from its markers)."""
        from PIL import Image

        subject = f"The {name}"
        try:
            check_jpeg(data, subject)  # before Pillow walks a JPEG's segments one by one
            with Image.open(budgeted(io.BytesIO(data), self.budget.decode_budget_s)) as probe:
                width, height = probe.size
                fmt = probe.format
        except ImageError as exc:
            raise ApiError(400, str(exc), param=ref.param, code="invalid_image") from None
        except OutOfTime:
            raise ApiError(400, out_of_time(subject, self.budget.decode_budget_s), param=ref.param) from None
        except Image.DecompressionBombError:
            raise _too_large(f"The {name} has too many pixels to decode safely; send a smaller one.", ref) from None
        except Exception:  # not an image at all: the decode words the error
            return Probed(data, name)
        pixels = width * height
        if pixels > self.budget.max_pixels:
            raise _too_large(
                f"The {name} is {width}x{height} = {pixels:,} pixels, over this server's limit of "
                f"{self.budget.max_pixels:,} pixels; send a smaller one.",
                ref,
            )
        if spent + pixels > self.budget.max_total_pixels:
            raise _too_large(
                f"The request's images add up to more than {self.budget.max_total_pixels:,} pixels, this "
                "server's limit per request; send fewer or smaller images.",
                ref,
            )
        if fmt not in IMAGE_FORMATS:
            raise ApiError(
                400, f"Images must be PNG, JPEG or WebP, not {fmt}.", param=ref.param, code="invalid_image_format"
            )
        if fmt == "JPEG":
            try:
                check_jpeg(data, subject, pixels)  # a large image may have fewer scans
            except ImageError as exc:
                raise ApiError(400, str(exc), param=ref.param, code="invalid_image") from None
        return Probed(data, name, width, height)

    def _decode(self, data: bytes, ref: ImageRef, name: str) -> Screenshot:
        key = hashlib.blake2b(data, digest_size=16).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            shot = load_image_bytes(
                data, max_pixels=self.budget.max_pixels, name=name, budget_s=self.budget.decode_budget_s
            )
        except ImageError as exc:
            raise ApiError(400, str(exc), param=ref.param, code="invalid_image") from None
        with self._lock:
            self._cache[key] = shot
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return shot


def _too_large(message: str, ref: ImageRef) -> ApiError:
    return ApiError(413, message, param=ref.param, code="image_too_large")
