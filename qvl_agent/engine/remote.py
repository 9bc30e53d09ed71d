"""A client for any OpenAI-compatible chat server: `qvl-agent serve`, vLLM or SGLang serving Qwen3-VL.

`RemoteEngine(url, api_key, model)` keeps the Engine/Session contract of `engine/base.py`: a session
remembers its turns locally and sends the whole conversation with each `ask` (the API is stateless),
images as base64 PNG data URLs, and streams the reply through the official `openai` client (its
retries with backoff, its timeouts); `top_k` and the penalties go in the body only when set.
A session's `tools` are sent too; a server that returns the model's calls as `tool_calls` (vLLM's
hermes parser, our own server) has them turned back into the model's `<tool_call>` text.
Servers that reuse prefixes by content (ours matches pooled sessions; vLLM and SGLang have prefix
caches) then prefill only the new tokens.
Stats come from the stream: time to first token is measured here; token counts come from the usage
chunk; when the server is qvl-agent's own, its `qvl` stats (vision hit/miss, prefill tokens) are used.

Every failure is a `RemoteEngineError` with one sentence: connection refused, a refused key (401),
any other 4xx/5xx with the server's own message, a timeout, or a connection that broke mid-answer.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import openai

from qvl_agent.config import DEFAULT_MODEL
from qvl_agent.engine.api_url import normalize_url
from qvl_agent.engine.base import Engine, GenerationOptions, Session, TurnStats
from qvl_agent.errors import GenerationCancelled, RemoteEngineError
from qvl_agent.image import Screenshot

STAT_FIELDS = ("preprocess_ms", "vision_ms", "prefill_tokens", "prompt_tokens", "cached_tokens")
MIN_DECODE_INTERVAL_S = 0.005  # first-to-last chunk gaps shorter than this are a burst, not a decode rate
MAX_RETRIES = 2  # the client's own: connection failures, 408/429/5xx, with backoff and Retry-After


class RemoteEngine(Engine):
    """An engine whose model runs behind an OpenAI-compatible HTTP API, through the `openai` client."""

    def __init__(
        self,
        url: str,
        api_key: str = "",
        model: str = DEFAULT_MODEL,
        timeout_s: float = 120.0,
        max_retries: int = MAX_RETRIES,
    ):
        self.base_url = normalize_url(url)
        self.name = f"openai:{self.base_url}"
        self.requested_model = model
        self.timeout_s = timeout_s
        # A server without authentication ignores the key; the client insists on having one.
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=max_retries
        )
        self._model: str | None = None
        self._lock = threading.Lock()
        self._png_urls: OrderedDict[str, str] = OrderedDict()  # content hash -> data URL

    def open_session(self, images=(), system=None, tools=None) -> RemoteSession:
        return RemoteSession(self, images, system, tools)

    def close(self) -> None:
        self.client.close()

    @property
    def model(self) -> str:
        """The model id to send: the one asked for when the server lists it; when qvl-agent was left on
        its default model and the server serves exactly one, that one (a server's single model is what
        the person meant); otherwise an error naming what the server has."""
        with self._lock:
            if self._model is None:
                self._model = self._resolve_model()
            return self._model

    def _resolve_model(self) -> str:
        try:
            served = [m.id for m in self.client.models.list()]
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise self.error(exc) from None
        except openai.APIStatusError:
            return self.requested_model  # a server without /models: trust the name given
        except openai.APIError as exc:
            raise self.error(exc) from None
        if self.requested_model in served or not served:
            return self.requested_model
        if self.requested_model == DEFAULT_MODEL and len(served) == 1:
            return served[0]
        raise RemoteEngineError(
            f"The model server at {self.base_url} does not serve {self.requested_model!r}; it serves "
            f"{', '.join(map(repr, served))} (pick one with --model)."
        )

    def image_url(self, shot: Screenshot) -> str:
        """A PNG data URL for the screenshot, encoded once per content hash (follow-ups resend it)."""
        key = shot.content_hash
        with self._lock:
            cached = self._png_urls.get(key)
            if cached is not None:
                self._png_urls.move_to_end(key)
                return cached
        url = "data:image/png;base64," + base64.b64encode(shot.to_png()).decode("ascii")
        with self._lock:
            self._png_urls[key] = url
            while len(self._png_urls) > 32:
                self._png_urls.popitem(last=False)
        return url

    def error(self, exc: openai.APIError) -> RemoteEngineError:
        """One sentence for whatever the client raised."""
        where = f"The model server at {self.base_url}"
        if isinstance(exc, openai.APITimeoutError):
            return RemoteEngineError(f"{where} did not answer within {self.timeout_s:g} s.")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            reason = "connection refused" if "refused" in str(cause).lower() else str(cause) or type(cause).__name__
            return RemoteEngineError(
                f"Cannot connect to the model server at {self.base_url} ({reason}); is it running?"
            )
        message = _message(exc)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                return RemoteEngineError(
                    f"{where} refused the API key ({status}: {message}); set QVL_API_KEY to its token."
                )
            return RemoteEngineError(f"{where} answered {status}: {message}.")
        return RemoteEngineError(f"{where} failed: {message}.")


def _message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        detail = body.get("error", body)
        body = detail.get("message") if isinstance(detail, dict) else detail
    return str(body or exc.message or type(exc).__name__).strip().rstrip(".")


class RemoteSession(Session):
    def __init__(self, engine: RemoteEngine, images, system, tools):
        super().__init__(images, system, tools)
        self.engine = engine
        self._stream: openai.Stream | None = None

    def cancel(self) -> None:
        super().cancel()
        stream = self._stream
        if stream is not None:
            stream.close()  # unblocks a read waiting on the server; ours then stops generating

    def _content(self, text: str, images: Sequence[Screenshot]):
        if not images:
            return text
        parts: list[dict] = [{"type": "image_url", "image_url": {"url": self.engine.image_url(im)}} for im in images]
        question = {"type": "text", "text": text}
        return [question, *parts] if self.text_first else [*parts, question]

    def messages(self, text: str, images: Sequence[Screenshot]) -> list[dict]:
        """The whole conversation as OpenAI messages, ending with the new user turn."""
        out: list[dict] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        for turn in self.turns:
            out.append({"role": "user", "content": self._content(turn.text, turn.images)})
            out.append({"role": "assistant", "content": turn.reply})
        out.append({"role": "user", "content": self._content(text, images)})
        return out

    def request(self, text: str, images: Sequence[Screenshot], options: GenerationOptions) -> dict:
        """The keyword arguments of `chat.completions.create` for this turn."""
        extra: dict = {}
        if options.top_k > 0:
            extra["top_k"] = options.top_k  # vLLM's and SGLang's extension (and ours)
        if options.presence_penalty != 0:
            extra["presence_penalty"] = options.presence_penalty
        if options.frequency_penalty != 0:
            extra["frequency_penalty"] = options.frequency_penalty
        if options.min_new_tokens:
            extra["min_tokens"] = options.min_new_tokens  # vLLM's extension; others ignore it
        kwargs = {
            "model": self.engine.model,
            "messages": self.messages(text, images),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": options.max_new_tokens,
            "temperature": options.temperature,
            "top_p": options.top_p,
        }
        if options.stop:
            kwargs["stop"] = list(options.stop)
        if self.tools:
            kwargs["tools"] = self.tools
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _generate(self, text: str, images: tuple[Screenshot, ...], options: GenerationOptions) -> Iterator[str]:
        engine = self.engine
        kwargs = self.request(text, images, options)
        start = time.perf_counter()
        first: float | None = None
        last: float | None = None
        pieces = 0
        usage: dict = {}
        qvl: dict = {}
        calls: dict[int, list[str]] = {}  # index -> [name, arguments], from a server that parses tool calls
        try:
            self._stream = stream = engine.client.chat.completions.create(**kwargs)
            if self.cancelled:
                raise GenerationCancelled("The answer was stopped.")
            for chunk in stream:
                if self.cancelled:
                    raise GenerationCancelled("The answer was stopped.")
                if chunk.usage is not None:
                    usage = chunk.usage.model_dump()
                qvl = (chunk.model_extra or {}).get("qvl") or qvl
                for choice in chunk.choices:
                    piece = choice.delta.content if choice.delta else None
                    if piece:
                        last = time.perf_counter()
                        first = first or last
                        pieces += 1
                        yield piece
                    for call in (choice.delta.tool_calls if choice.delta else None) or ():
                        last = time.perf_counter()
                        first = first or last
                        _gather(calls, call)
            for i, (name, arguments) in enumerate(calls.values()):
                # The calls as the model wrote them, so the session's history and its reader see its text.
                yield ("\n" if i or pieces else "") + tool_call_text(name, arguments or "{}")
        except openai.APIError as exc:
            if self.cancelled:
                raise GenerationCancelled("The answer was stopped.") from None
            raise engine.error(exc) from None
        except Exception:
            if self.cancelled:  # the stream was closed under a read: that is the cancel, not a failure
                raise GenerationCancelled("The answer was stopped.") from None
            raise
        finally:
            stream, self._stream = self._stream, None
            if stream is not None:
                stream.close()
        end = time.perf_counter()
        self.last_stats = _stats(start, first, last, end, pieces, usage, qvl, images)


def tool_call_text(name: str, arguments: str) -> str:
    """One tool call in Qwen3-VL's own format, as its chat template renders an assistant's call."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def _gather(calls: dict[int, list[str]], delta) -> None:
    """Add a streamed `delta.tool_calls` item to the calls, joined by index as OpenAI clients join them."""
    slot = calls.setdefault(delta.index if delta.index is not None else len(calls), ["", ""])
    if delta.function is not None:
        slot[0] += delta.function.name or ""
        slot[1] += delta.function.arguments or ""


def _decode_rate(decoded: int, first: float | None, last: float | None, qvl: dict) -> float:
    """Tokens per second while decoding: the server's own figure when it sends one (ours does, in `qvl`).
    Otherwise from the first to the last content chunk, which is only an estimate: chunks that a server
    or proxy buffers arrive in a burst, so an interval too short to measure says nothing (0.0)."""
    server = qvl.get("decode_tokens_per_s")
    if isinstance(server, int | float) and not isinstance(server, bool):
        return float(server)
    if first is None or last is None or decoded < 2 or last - first < MIN_DECODE_INTERVAL_S:
        return 0.0
    return (decoded - 1) / (last - first)


def _stats(start, first, last, end, pieces, usage: dict, qvl: dict, images) -> TurnStats:
    decoded = int(usage.get("completion_tokens") or pieces)
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    values = {"prompt_tokens": prompt, "cached_tokens": cached, "prefill_tokens": max(prompt - cached, 0)}
    values.update({k: qvl[k] for k in STAT_FIELDS if isinstance(qvl.get(k), int | float)})
    # Without the server's word, assume new images went through the vision tower.
    vision = qvl.get("vision") if qvl.get("vision") in ("hit", "miss", "none") else ("miss" if images else "none")
    return TurnStats(
        vision=vision,
        ttft_ms=((first or end) - start) * 1000,
        decode_tokens=decoded,
        decode_tokens_per_s=_decode_rate(decoded, first, last, qvl),
        total_ms=(end - start) * 1000,
        **values,
    )
