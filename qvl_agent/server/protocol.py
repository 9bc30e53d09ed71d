"""The OpenAI chat-completions wire format: request models, the conversation they stand for, replies.

`parse_chat_request` validates a request body with the Pydantic models below (pydantic-core's JSON
parser: nesting depth, huge numbers and lone surrogates are invalid JSON, not crashes) and turns it into
a `ChatRequest`: the system text, the history as (user text, user images, assistant reply) turns, and
the last user message that is to be answered. Images stay `ImageRef`s (a URL and where it was in the
request) until the server has admitted the request; `images.ImageDecoder.resolve` decodes them then.
An assistant's `tool_calls` and the `tool` messages answering them become the text Qwen3-VL's template
renders for them (`tools`); the `tools` themselves travel to the engine, whose template shows them. A
parameter the server cannot honour is refused with a 400 naming it, never silently ignored.

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
from qvl_agent.server import structured
from qvl_agent.server.api_error import ApiError
from qvl_agent.server.tools import START as TOOL_CALL_START
from qvl_agent.server.tools import assistant_text, tool_result_text

MAX_TOKENS_CAP = 32_768  # beyond any sane reply; the engine's context is the real bound
MAX_STOP_STRINGS = 4  # OpenAI's own limit
MAX_STOP_CHARS = 256  # holding back a stop string costs time in its length: keep it short
# Validation runs in compiled code that holds the interpreter lock, so a body of millions of tiny values
# (a million messages, a list of a million numbers in a few MB) would stall every other request, /health
# included, for seconds. Commas, objects and arrays bound the number of values; an honest conversation
# under the prompt-token cap has far fewer, and counting them costs a fraction of a second for 64 MB.
MAX_JSON_ITEMS = 100_000
MAX_TOOLS = 128  # OpenAI's own limit
MAX_NAME_CHARS = 64


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


class FunctionCall(_Model):
    name: str = Field(max_length=MAX_NAME_CHARS)
    arguments: str


class ToolCallIn(_Model):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant messages: the calls it made
    tool_call_id: str | None = None  # tool messages: the call answered (Qwen's template does not show it)


class FunctionDef(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Model):
    name: str = Field(max_length=MAX_NAME_CHARS)


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Model):
    name: str = Field("response", max_length=MAX_NAME_CHARS)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


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
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)  # like presence_penalty: when sampling
    n: int | None = None
    stop: str | list[str] | None = None
    # vLLM's prefix-cache scope: requests with different salts share no session, KV cache or vision
    # features, so no cache hit tells one client what another sent.
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # OpenAI parameters this server cannot honour: their neutral values pass, anything else is refused
    # (`_refuse_unsupported`) rather than silently ignored.
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None

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
_MODELS = (ChatCompletionRequest, Message, TextPart, ImagePart, ImageUrl, ToolCallIn, FunctionCall, Tool, FunctionDef)
_MODELS += (NamedToolChoice, NamedFunction, ResponseFormat, JsonSchemaFormat)
_FIELDS = {field.alias or name for m in _MODELS for name, field in m.model_fields.items()}


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
    tools: list[dict] | None = None  # shown to the model by its chat template; None with tool_choice "none"
    single_tool_call: bool = False  # parallel_tool_calls=false: only the first call is returned
    forced_call: bool = False  # tool_choice "required" or named: the reply must begin with a call
    response_format: str = "text"  # "text", "json_object" or "json_schema"
    schema: dict | None = None  # json_schema's schema, checked (`structured.check_schema`)

    @property
    def tool_names(self) -> frozenset[str]:
        """The functions a reply may call; empty when replies are not parsed for calls."""
        return frozenset(t["function"]["name"] for t in self.tools or ())

    text_first: bool = False  # a user message put its text before its image (MAI-UI's order): keep it so

    def image_refs(self) -> list[ImageRef]:
        """Every image of the conversation that is still to be decoded, in order."""
        everything = [im for turn in self.history for im in turn.images] + list(self.images)
        return [im for im in everything if isinstance(im, ImageRef)]

    def texts(self) -> list[str]:
        """Every piece of text the model will read (for counting prompt tokens)."""
        tools = json.dumps(self.tools, ensure_ascii=False) if self.tools else ""
        return [self.system or "", tools, *(s for t in self.history for s in (t.text, t.reply)), self.text]


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
    _refuse_unsupported(body)
    fmt, schema = _response_format(body.response_format)

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
        elif msg.role in ("user", "tool"):
            if msg.role == "tool":  # a tool's result joins the user turn that carries results
                previous = body.messages[i - 1] if i else None
                if previous is None or not (previous.role == "tool" or previous.tool_calls):
                    raise ApiError(
                        400,
                        "A tool message must follow an assistant message with tool_calls (or another tool message).",
                        param=f"messages[{i}].role",
                    )
                text = tool_result_text(text)
            elif not text.strip() and not images:  # the model would be asked nothing at all
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
            if msg.tool_calls:  # the calls as the model wrote them, so the model reads its own words
                text = assistant_text(text, [(c.function.name, c.function.arguments) for c in msg.tool_calls])
            turns[-1][2] = (turns[-1][2] or "") + text
    if not turns or turns[-1][2] is not None:
        raise ApiError(400, "The last message must be from the user or a tool.", param="messages")
    if fmt != "text":  # the model is told what to write; the reply is checked against it
        system_parts.append(structured.instruction(fmt, schema))
    choice = body.tool_choice or "auto"
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and choice != "none" else None

    call_prefix = _call_prefix(body)
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
        frequency_penalty=body.frequency_penalty or 0.0,
        stop=stop,
        min_new_tokens=min_new_tokens,
        # A JSON reply begins with "{" where the engine can begin it (others are only checked).
        reply_prefix=call_prefix or ("{" if fmt != "text" and not tools else ""),
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
        tools=tools,
        single_tool_call=body.parallel_tool_calls is False,
        forced_call=bool(call_prefix),
        response_format=fmt,
        schema=schema,
        text_first=text_first,
    )


def _refuse_unsupported(body: ChatCompletionRequest) -> None:
    """400 naming the first parameter asked for something this server cannot do; neutral values pass."""
    leave_out = "leave it out"
    unsupported = {
        "n": (body.n not in (None, 1), "Only n=1 is supported."),
        "logprobs": (bool(body.logprobs), "leave it out or set it to false"),
        "top_logprobs": (body.top_logprobs not in (None, 0), leave_out),
        "logit_bias": (bool(body.logit_bias), leave_out),
        "functions": (body.functions is not None, "use tools"),
        "function_call": (body.function_call is not None, "use tool_choice"),
        "audio": (body.audio is not None, leave_out),
        "modalities": (body.modalities not in (None, ["text"]), 'only ["text"] is'),
        "prediction": (body.prediction is not None, leave_out),
        "web_search_options": (body.web_search_options is not None, leave_out),
        "reasoning_effort": (body.reasoning_effort is not None, leave_out),
        "verbosity": (body.verbosity is not None, leave_out),
    }
    for param, (asked, hint) in unsupported.items():
        if asked:
            message = hint if hint.endswith(".") else f"{param} is not supported by this server; {hint}."
            raise ApiError(400, message, param=param)


def _call_prefix(body: ChatCompletionRequest) -> str:
    """The opening of a call that `tool_choice` "required" or a named function makes the reply begin
    with (the model writes the rest), or "" when the model decides."""
    choice = body.tool_choice
    if choice is None or choice in ("none", "auto"):
        return ""
    if not body.tools:
        raise ApiError(400, "tool_choice asks for a tool call, but the request has no tools.", param="tool_choice")
    if choice == "required":
        return f'{TOOL_CALL_START}\n{{"name":'  # the model picks the function
    if choice.function.name not in {t.function.name for t in body.tools}:
        raise ApiError(
            400, f"tool_choice names {choice.function.name!r}, which is not one of the tools.", param="tool_choice"
        )
    # Cut before the space that opens the arguments: the model's own tokens carry it, as it would write it.
    return f'{TOOL_CALL_START}\n{{"name": {json.dumps(choice.function.name)}, "arguments":'


def _response_format(fmt: ResponseFormat | None) -> tuple[str, dict | None]:
    if fmt is None or fmt.type == "text":
        return "text", None
    if fmt.type == "json_object":
        return "json_object", None
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(
            400, "response_format json_schema needs json_schema.schema.", param="response_format.json_schema"
        )
    return "json_schema", structured.check_schema(fmt.json_schema.schema_)


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


def completion_body(cid: str, model: str, message: dict, finish: str, usage: dict, qvl: dict) -> dict:
    choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
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
