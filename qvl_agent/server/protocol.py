"""The OpenAI chat-completions wire format: parsing requests into a conversation, and shaping replies.

`parse_chat_request` turns a request body into a `ChatRequest`: the system text, the history as
(user text, user images, assistant reply) turns, and the last user message that is to be answered.
Every problem becomes an `ApiError` carrying the HTTP status and OpenAI's error JSON shape
`{"error": {"message", "type", "param", "code"}}`; the message is one sentence a person can act on.

This module knows nothing about engines, sessions or the HTTP server itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from qvl_agent.engine.base import GenerationOptions, sampling_defaults
from qvl_agent.errors import ImageError
from qvl_agent.image import Screenshot, load_image_bytes

IMAGE_MIME_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP"}
MAX_TOKENS_CAP = 32_768  # beyond any sane reply; the engine's context is the real bound


class ApiError(Exception):
    """An error answered to the client in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class HistoryTurn:
    """One earlier exchange as the client remembers it."""

    text: str
    images: tuple[Screenshot, ...]
    reply: str


@dataclass
class ChatRequest:
    model: str
    system: str | None
    history: list[HistoryTurn]
    text: str  # the last user message, to be answered
    images: tuple[Screenshot, ...]
    options: GenerationOptions
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = field(default_factory=tuple)


class ImageDecoder:
    """Decodes image parts into Screenshots, with a small LRU so that a stateless client re-sending the
    same screenshot on every follow-up pays for the PNG decode once."""

    def __init__(
        self,
        max_pixels: int,
        allow_urls: bool = False,
        fetch: Callable[[str], bytes] | None = None,
        cache_entries: int = 16,
    ):
        self.max_pixels = max_pixels
        self.allow_urls = allow_urls
        self.fetch = fetch
        self._cache: OrderedDict[str, Screenshot] = OrderedDict()
        self._entries = cache_entries
        self._lock = threading.Lock()

    def decode(self, url: str, param: str) -> Screenshot:
        if url.startswith(("http://", "https://")):
            if not self.allow_urls or self.fetch is None:
                raise ApiError(
                    400,
                    "Image URLs are not fetched by this server; send the image as a base64 "
                    "data: URL (start the server with --allow-image-urls to allow them).",
                    param=param,
                    code="image_url_not_allowed",
                )
            return self._from_bytes(self.fetch(url), param, "image at " + url)
        if not url.startswith("data:"):
            raise ApiError(
                400,
                "An image_url must be a base64 data: URL (data:image/png;base64,...).",
                param=param,
                code="invalid_image_url",
            )
        header, sep, payload = url.partition(",")
        mime = header[5:].split(";")[0].strip().lower()
        if not sep or ";base64" not in header.lower():
            raise ApiError(
                400,
                "An image data: URL must be base64-encoded (data:image/png;base64,...).",
                param=param,
                code="invalid_image_url",
            )
        if mime not in IMAGE_MIME_TYPES:
            raise ApiError(
                400,
                f"Images must be PNG, JPEG or WebP, not {mime or 'an unnamed type'}.",
                param=param,
                code="invalid_image_format",
            )
        key = hashlib.blake2b(payload.encode("ascii", "replace"), digest_size=16).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            data = base64.b64decode(payload.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "The image data is not valid base64.", param=param, code="invalid_base64") from None
        shot = self._from_bytes(data, param, "image")
        with self._lock:
            self._cache[key] = shot
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return shot

    def _from_bytes(self, data: bytes, param: str, name: str) -> Screenshot:
        from PIL import Image

        # Read only the header first: an over-limit image is a 413, not a decode attempt.
        try:
            with Image.open(io.BytesIO(data)) as probe:
                width, height = probe.size
                fmt = probe.format
        except Image.DecompressionBombError:
            raise ApiError(
                413,
                f"The {name} has too many pixels to decode safely; send a smaller one.",
                param=param,
                code="image_too_large",
            ) from None
        except Exception:  # not an image at all: load_image_bytes below words the error
            width = height = 0
            fmt = None
        if width * height > self.max_pixels:
            raise ApiError(
                413,
                f"The {name} is {width}x{height} = {width * height:,} pixels, over this "
                f"server's limit of {self.max_pixels:,} pixels; send a smaller one.",
                param=param,
                code="image_too_large",
            )
        if fmt is not None and fmt not in ("PNG", "JPEG", "WEBP"):
            raise ApiError(
                400, f"Images must be PNG, JPEG or WebP, not {fmt}.", param=param, code="invalid_image_format"
            )
        try:
            return load_image_bytes(data, max_pixels=self.max_pixels, name=name)
        except ImageError as exc:
            raise ApiError(400, str(exc), param=param, code="invalid_image") from None


def _text_and_images(content, param: str, decoder: ImageDecoder, images_allowed: bool):
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise ApiError(400, "A message's content must be a string or a list of parts.", param=param)
    texts: list[str] = []
    images: list[Screenshot] = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            if not images_allowed:
                raise ApiError(400, "Only user messages can carry images.", param=where)
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            if not isinstance(url, str):
                raise ApiError(400, "An image_url part needs an image_url.url string.", param=where)
            images.append(decoder.decode(url, where))
        else:
            raise ApiError(
                400,
                "Each content part must be {type: text, text} or {type: image_url, image_url}.",
                param=where,
            )
    return "\n".join(texts), images


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise ApiError(400, f"{name} must be {kind} from {low:g} to {high:g}, not {value!r}.", param=name)
    return value


def parse_chat_request(raw: bytes, decoder: ImageDecoder, default_max_tokens: int) -> ChatRequest:
    """A validated ChatRequest from a request body, or ApiError saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The request body is not valid JSON ({exc}).", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list.", param="messages")
    if body.get("n") not in (None, 1):
        raise ApiError(400, "Only n=1 is supported.", param="n")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string.", param="model")

    system_parts: list[str] = []
    turns: list[list] = []  # [user text parts, user images, reply parts]
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ApiError(400, "Each message must be an object with a role and content.", param=param)
        role = msg.get("role")
        text, images = _text_and_images(msg.get("content"), f"{param}.content", decoder, role == "user")
        if role in ("system", "developer"):
            system_parts.append(text)
        elif role == "user":
            if not text.strip() and not images:  # the model would be asked nothing at all
                raise ApiError(
                    400, "A user message needs some text or an image; this one is empty.", param=f"{param}.content"
                )
            # Consecutive user messages form one turn; a user message after a reply starts a new one.
            if not turns or turns[-1][2] is not None:
                turns.append([[], [], None])
            turns[-1][0].append(text)
            turns[-1][1].extend(images)
        elif role == "assistant":
            if not turns:
                turns.append([[], [], None])
            turns[-1][2] = (turns[-1][2] or "") + text
        else:
            raise ApiError(
                400,
                f"Unsupported message role {role!r}: use system, user or assistant.",
                param=f"{param}.role",
            )
    if not turns or turns[-1][2] is not None:
        raise ApiError(400, "The last message must be from the user.", param="messages")

    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop):
        stop = tuple(stop)
    else:
        raise ApiError(400, "stop must be a string or a list of up to 4 non-empty strings.", param="stop")
    max_tokens = _number(body, "max_completion_tokens", None, 1, MAX_TOKENS_CAP, integer=True)
    max_tokens = _number(body, "max_tokens", max_tokens or default_max_tokens, 1, MAX_TOKENS_CAP, integer=True)
    temperature = float(_number(body, "temperature", 0.0, 0.0, 2.0))
    recipe = sampling_defaults(temperature)  # what the client leaves out follows the model card
    options = GenerationOptions(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=float(_number(body, "top_p", recipe["top_p"], 0.0, 1.0)),
        top_k=int(_number(body, "top_k", recipe["top_k"], 0, 1_000_000, integer=True)),
        presence_penalty=float(_number(body, "presence_penalty", recipe["presence_penalty"], -2.0, 2.0)),
        stop=stop,
    )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false.", param="stream")
    stream_options = body.get("stream_options") or {}
    include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))

    history = [HistoryTurn("\n".join(t[0]), tuple(t[1]), t[2]) for t in turns[:-1]]
    last = turns[-1]
    return ChatRequest(
        model=model,
        system="\n".join(system_parts) if system_parts else None,
        history=history,
        text="\n".join(last[0]),
        images=tuple(last[1]),
        options=options,
        stream=stream,
        include_usage=include_usage,
        stop=stop,
    )


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def usage_dict(stats: dict, completion_tokens: int) -> dict:
    prompt = int(stats.get("prompt_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": int(stats.get("cached_tokens", 0))},
    }


def completion_body(cid: str, model: str, text: str, finish: str, usage: dict, qvl: dict) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": usage,
        "qvl": qvl,
    }


def chunk_body(cid: str, model: str, delta: dict, finish: str | None = None, **extra) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def sse(data: dict | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
