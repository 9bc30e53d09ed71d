"""Image parts into Screenshots, after the request was admitted and within its budget.

`ImageDecoder.resolve(chat)` decodes every `ImageRef` of a request: base64 `data:` URLs (PNG, JPEG,
WebP), or http(s) URLs through a `fetch.ImageFetcher` when the server allows them. A request may carry at
most `max_images` images and `max_total_pixels` pixels in all (413 otherwise); sizes are read from the
image headers before anything is decoded, so a refused request costs no decoding. A small LRU keeps
recent decodes, so a stateless client that re-sends the same screenshot with every follow-up pays for
the decode once.
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


class ImageDecoder:
    def __init__(self, budget: ImageBudget, fetcher: ImageFetcher | None = None, cache_entries: int = 16):
        self.budget = budget
        self.fetcher = fetcher
        self._cache: OrderedDict[str, Screenshot] = OrderedDict()
        self._entries = cache_entries
        self._lock = threading.Lock()

    def resolve(self, chat: ChatRequest) -> ChatRequest:
        """The same request with every image decoded, or ApiError (400 bad image, 413 over budget)."""
        refs = chat.image_refs()
        if len(refs) > self.budget.max_images:
            raise ApiError(
                413,
                f"The request carries {len(refs)} images; this server takes at most {self.budget.max_images} "
                "per request.",
                param="messages",
                code="too_many_images",
            )
        decoded: dict[ImageRef, Screenshot] = {}
        total = 0
        for ref in refs:
            if ref not in decoded:
                data, name = self._bytes(ref)
                total += self._check_size(data, ref, name, total)
                decoded[ref] = self._decode(data, ref, name)

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

    def _check_size(self, data: bytes, ref: ImageRef, name: str, spent: int) -> int:
        """The image's pixel count, read from its header only; 413 past either limit."""
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as probe:
                width, height = probe.size
                fmt = probe.format
        except Image.DecompressionBombError:
            raise _too_large(f"The {name} has too many pixels to decode safely; send a smaller one.", ref) from None
        except Exception:  # not an image at all: the decode words the error
            return 0
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
        return pixels

    def _decode(self, data: bytes, ref: ImageRef, name: str) -> Screenshot:
        key = hashlib.blake2b(data, digest_size=16).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            shot = load_image_bytes(data, max_pixels=self.budget.max_pixels, name=name)
        except ImageError as exc:
            raise ApiError(400, str(exc), param=ref.param, code="invalid_image") from None
        with self._lock:
            self._cache[key] = shot
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return shot


def _too_large(message: str, ref: ImageRef) -> ApiError:
    return ApiError(413, message, param=ref.param, code="image_too_large")
