"""The OpenAI chat-completions wire format: request models, the conversation they stand for, replies.

`parse_chat_request` validates a request body with the Pydantic models below (pydantic-core's JSON
parser: nesting depth, huge numbers and lone surrogates are invalid JSON, not crashes) and turns it into
a `ChatRequest`: the system text, the history as (user text, user images, assistant reply) turns, and
the last user message that is to be answered. Images stay `ImageRef`s (a URL and where it was in the
request) until the server has admitted the request; `images.ImageDecoder.resolve` decodes them then.

Every problem becomes an `ApiError` carrying the HTTP status and OpenAI's error JSON shape
`{"error": {"message", "type", "param", "code"}}`; the message is one sentence a person can act on.
This module knows nothing about engines, sessions or the HTTP server itself.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from qvl_agent.engine.base import GenerationOptions, sampling_defaults
from qvl_agent.image import Screenshot

MAX_TOKENS_CAP = 32_768  # beyond any sane reply; the engine's context is the real bound
MAX_STOP_STRINGS = 4  # OpenAI's own limit
MAX_STOP_CHARS = 256  # holding back a stop string costs time in its length: keep it short
# Validation runs in compiled code that holds the interpreter lock, so a body of millions of tiny values
# (a million messages, a list of a million numbers in a few MB) would stall every other request, /health
# included, for seconds. Commas, objects and arrays bound the number of values; an honest conversation
# under the prompt-token cap has far fewer, and counting them costs a fraction of a second for 64 MB.
MAX_JSON_ITEMS = 100_000


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


# --- the request as OpenAI clients send it ------------------------------------------------------------


class _Model(BaseModel):
    # Strict: `true` is not a number and `1` is not `true`. Unknown fields are ignored, as OpenAI's own
    # clients send some (user, seed, ...) that change nothing here.
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Model):
    type: Literal["text"]
    text: str


class ImageUrl(_Model):
    url: str
    detail: str | None = None


class ImagePart(_Model):
    type: Literal["image_url"]
    image_url: ImageUrl | str


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(_Model):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


class StreamOptions(_Model):
    include_usage: bool = False


class ChatCompletionRequest(_Model):
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP)
    # vLLM's extension: end tokens are refused until the reply has this many tokens. Benchmarks on
    # random-weight models need it to ask for a fixed length; nobody else should.
    min_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS_CAP)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    # Left out, these follow the model card's recipe when sampling (`sampling_defaults`).
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1_000_000)  # vLLM's extension; 0 means no cut
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    n: int | None = None
    stop: str | list[str] | None = None
    # vLLM's prefix-cache scope: requests with different salts share no session, KV cache or vision
    # features, so no cache hit tells one client what another sent.
    cache_salt: str | None = Field(None, min_length=1, max_length=256)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS or not all(0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise ValueError(
                f"stop must be a string or a list of up to {MAX_STOP_STRINGS} strings, "
                f"each 1 to {MAX_STOP_CHARS} characters"
            )
        return value


# Field names of the models above: everything else in a validation error's location is pydantic's name
# for a union member ("str", "list[...]"), which means nothing to the client.
_FIELDS = {name for m in (ChatCompletionRequest, Message, TextPart, ImagePart, ImageUrl) for name in m.model_fields}


# --- the conversation it stands for -------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRef:
    """An image part not decoded yet: its URL and where it was in the request (for error messages)."""

    url: str
    param: str


@dataclass(frozen=True)
class HistoryTurn:
    """One earlier exchange as the client remembers it."""

    text: str
    images: tuple[Screenshot | ImageRef, ...]
    reply: str


@dataclass
class ChatRequest:
    model: str
    system: str | None
    history: list[HistoryTurn]
    text: str  # the last user message, to be answered
    images: tuple[Screenshot | ImageRef, ...]
    options: GenerationOptions
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = field(default_factory=tuple)
    scope: str = ""  # the cache scope: the user's name (several tokens) and the request's cache_salt
    text_first: bool = False  # a user message put its text before its image (MAI-UI's order): keep it so

    def image_refs(self) -> list[ImageRef]:
        """Every image of the conversation that is still to be decoded, in order."""
        everything = [im for turn in self.history for im in turn.images] + list(self.images)
        return [im for im in everything if isinstance(im, ImageRef)]

    def texts(self) -> list[str]:
        """Every piece of text the model will read (for counting prompt tokens)."""
        return [self.system or "", *(s for t in self.history for s in (t.text, t.reply)), self.text]


def parse_chat_request(raw: bytes, default_max_tokens: int, user: str = "") -> ChatRequest:
    """A validated ChatRequest from a request body, or ApiError saying what is wrong with it. `user` (the
    token's user, with several tokens) and the body's `cache_salt` make its cache scope."""
    items = 0
    for mark in (b",", b"{", b"["):
        items += raw.count(mark)
        if items > MAX_JSON_ITEMS:
            raise ApiError(
                413,
                f"The request holds more than {MAX_JSON_ITEMS:,} JSON values; send a shorter conversation.",
                code="request_too_large",
            )
    try:
        body = ChatCompletionRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if body.n not in (None, 1):
        raise ApiError(400, "Only n=1 is supported.", param="n")

    system_parts: list[str] = []
    turns: list[list] = []  # [user text parts, user images, reply or None]
    text_first = False
    for i, msg in enumerate(body.messages):
        param = f"messages[{i}].content"
        text, images = _text_and_images(msg.content, param)
        if msg.role in ("system", "developer"):
            if images:
                raise ApiError(400, "Only user messages can carry images.", param=param)
            system_parts.append(text)
        elif msg.role == "user":
            if not text.strip() and not images:  # the model would be asked nothing at all
                raise ApiError(400, "A user message needs some text or an image; this one is empty.", param=param)
            # Consecutive user messages form one turn; a user message after a reply starts a new one.
            if not turns or turns[-1][2] is not None:
                turns.append([[], [], None])
            turns[-1][0].append(text)
            turns[-1][1].extend(images)
            text_first = text_first or _text_before_image(msg.content)
        else:
            if images:
                raise ApiError(400, "Only user messages can carry images.", param=param)
            if not turns:
                turns.append([[], [], None])
            turns[-1][2] = (turns[-1][2] or "") + text
    if not turns or turns[-1][2] is not None:
        raise ApiError(400, "The last message must be from the user.", param="messages")

    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    recipe = sampling_defaults(body.temperature)  # what the client leaves out follows the model card
    max_new_tokens = body.max_tokens or body.max_completion_tokens or default_max_tokens
    min_new_tokens = body.min_tokens or 0
    if min_new_tokens > max_new_tokens:
        which = "" if body.max_tokens or body.max_completion_tokens else ", this server's default"
        raise ApiError(
            400,
            f"min_tokens must be at most max_tokens ({max_new_tokens}{which}), not {min_new_tokens}.",
            param="min_tokens",
        )
    options = GenerationOptions(
        max_new_tokens=max_new_tokens,
        temperature=body.temperature,
        top_p=recipe["top_p"] if body.top_p is None else body.top_p,
        top_k=recipe["top_k"] if body.top_k is None else body.top_k,
        presence_penalty=recipe["presence_penalty"] if body.presence_penalty is None else body.presence_penalty,
        stop=stop,
        min_new_tokens=min_new_tokens,
    )
    return ChatRequest(
        model=body.model,
        system="\n".join(system_parts) if system_parts else None,
        history=[HistoryTurn("\n".join(t[0]), tuple(t[1]), t[2]) for t in turns[:-1]],
        text="\n".join(turns[-1][0]),
        images=tuple(turns[-1][1]),
        options=options,
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        stop=stop,
        scope=cache_scope(user, body.cache_salt),
        text_first=text_first,
    )


def cache_scope(user: str, salt: str | None) -> str:
    """The scope a request's caches live in: its user (when the server has several tokens) and salt."""
    return f"{len(user)}:{user}:{salt or ''}" if user or salt else ""


def _text_before_image(content: str | list | None) -> bool:
    """Whether a message's text comes before its first image (an order some models were trained on)."""
    if not isinstance(content, list):
        return False
    for part in content:
        if isinstance(part, TextPart):
            if part.text.strip():
                return True
        else:
            return False
    return False


def _text_and_images(content: str | list | None, param: str) -> tuple[str, list[ImageRef]]:
    if content is None or isinstance(content, str):
        return content or "", []
    texts: list[str] = []
    images: list[ImageRef] = []
    for i, part in enumerate(content):
        if isinstance(part, TextPart):
            texts.append(part.text)
        else:
            url = part.image_url.url if isinstance(part.image_url, ImageUrl) else part.image_url
            images.append(ImageRef(url, f"{param}[{i}]"))
    return "\n".join(texts), images


def validation_error(exc: ValidationError) -> ApiError:
    """One sentence for the most specific problem pydantic found, naming the parameter."""
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        reason = errors[0].get("ctx", {}).get("error") or errors[0]["msg"]
        return ApiError(400, f"The request body is not valid JSON ({reason}).", code="invalid_json")
    # The deepest location is the most specific: a bad part of a list beats "is not a string".
    error = max(errors, key=lambda e: len(e["loc"]))
    param = _param(error["loc"])
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "model_type" and not param:
        return ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    if kind == "missing":
        message = f"{param} is required."
    elif kind == "value_error":
        message = str(ctx.get("error", error["msg"])).rstrip(".") + "."
    elif kind in ("greater_than_equal", "less_than_equal", "too_short", "too_long"):
        message = f"{param} {error['msg'][0].lower()}{error['msg'][1:]}, not {_short(error['input'])}."
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        message = "Each content part must be {type: text, text} or {type: image_url, image_url}."
    elif kind == "literal_error" and param.endswith("role"):
        message = f"Unsupported message role {_short(error['input'])}: use system, user or assistant."
    else:
        message = (
            f"{param or 'The request'}: {error['msg'][0].lower()}{error['msg'][1:]}, not {_short(error['input'])}."
        )
    return ApiError(400, message, param=param or None)


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELDS:
            out += ("." if out else "") + part
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- replies ------------------------------------------------------------------------------------------


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
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish, "logprobs": None}
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
        "qvl": qvl,
    }


def chunk_body(cid: str, model: str, delta: dict | None, finish: str | None = None, **extra) -> dict:
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
