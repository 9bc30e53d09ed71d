"""An OpenAI-compatible HTTP API over one resident engine, plus a small chat page.

    POST /v1/chat/completions   text and image_url parts (base64 data: URLs), streaming (SSE) or not,
                                tools (`tools`) and JSON replies (`structured`)
    GET  /v1/models             the one model this server answers with
    GET  /health                liveness and queue depth (no token needed)
    GET  /metrics               Prometheus text: requests, latency, ttft, tokens/s, feature cache, queue
    GET  /                      the chat page; opened as /?token=TOKEN, like Jupyter

Every other route needs `Authorization: Bearer TOKEN` (`auth.Authenticator`, one dependency) unless the
server runs without a token. Errors use OpenAI's JSON shape. A chat request is read (`transport`),
validated (`protocol`), given a place in the queue, and only then has its images decoded (`images`) and
its prompt counted (`budget`) before generation runs on the one worker thread (`worker`); stateless
clients reuse pooled sessions matched by content (`pool`), and each response says whether it did: the
usage's `prompt_tokens_details.cached_tokens`, a `qvl` object with the turn's stats, and for
non-streaming replies the headers `x-qvl-vision` (hit|miss|none), `x-qvl-prefill-tokens` and
`x-qvl-session-reused`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from qvl_agent.config import DEFAULT_MODEL, Settings
from qvl_agent.engine.base import Engine
from qvl_agent.server.auth import Authenticator, user_of
from qvl_agent.server.budget import check_prompt_tokens
from qvl_agent.server.fetch import ImageFetcher
from qvl_agent.server.images import ImageBudget, ImageDecoder
from qvl_agent.server.metrics import CONTENT_TYPE, Metrics, RequestMetrics
from qvl_agent.server.pool import SessionPool
from qvl_agent.server.protocol import (
    ApiError,
    ChatRequest,
    completion_body,
    completion_id,
    parse_chat_request,
    usage_dict,
)
from qvl_agent.server.stream import (
    Reader,
    answer,
    api_error,
    qvl_stats,
    replay_chunks,
    stat_headers,
    stream_chunks,
)
from qvl_agent.server.transport import BODY_TIMEOUT_S, ClientGone, read_body
from qvl_agent.server.worker import ChatResult, Job, Scheduler, chat_work

ENDPOINTS = {"/", "/health", "/metrics", "/v1/models", "/v1/chat/completions"}
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the token is in the URL: never leak it
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; connect-src 'self'",
}


@dataclass
class Server:
    """Everything the routes share, kept on `app.state.server`."""

    engine: Engine
    settings: Settings
    model_id: str
    aliases: set[str]
    tokens: dict[str, str] | None  # user -> token; {"": TOKEN} with one token; None: no authentication
    pool: SessionPool
    scheduler: Scheduler
    decoder: ImageDecoder
    metrics: Metrics
    max_body_bytes: int
    body_timeout_s: float
    request_timeout_s: float
    max_prompt_tokens: int

    def admit(self, chat: ChatRequest) -> ChatRequest:
        """Check the request's images from their headers and its prompt's tokens, then decode the images;
        runs once it holds a place in the queue. Nothing is decoded for a request refused by any check."""
        probed = self.decoder.probe(chat)
        sizes = {ref: (p.width, p.height) for ref, p in probed.items() if p.width}
        tokenizer = getattr(self.engine, "tokenizer", None)
        check_prompt_tokens(chat, tokenizer, self.max_prompt_tokens, self.decoder.budget.max_pixels, sizes)
        return self.decoder.decode(chat, probed)


def create_app(
    engine: Engine,
    settings: Settings,
    *,
    token: str | None = None,
    model_id: str | None = None,
    max_queue: int = 16,
    max_body_bytes: int = 64 * 1024 * 1024,
    max_image_pixels: int | None = None,
    max_images: int = 16,
    max_total_pixels: int = 40_000_000,
    max_prompt_tokens: int = 32_768,
    request_timeout_s: float = 300.0,
    body_timeout_s: float = BODY_TIMEOUT_S,
    pool_size: int = 8,
    allow_image_urls: bool = False,
    fetcher: ImageFetcher | None = None,
    on_ready: Callable[[], None] | None = None,
    users: dict[str, str] | None = None,
) -> FastAPI:
    """The API app over `engine`. `token=None` and no `users` disable authentication (the caller checks
    loopback); `users` ({name: token}, `serve --tokens-file`) gives each user a token of their own, and
    users never share sessions, KV caches or vision features. `on_ready` runs once the server accepts
    requests (`serve` prints its address then)."""
    tokens = dict(users) if users else {"": token} if token is not None else None
    model_id = model_id or settings.model
    batcher = getattr(engine, "batcher", None)  # overlapping turns decode together: one worker per row
    workers = len(batcher.kv.rows) if batcher is not None else 1
    pool, scheduler = SessionPool(max(pool_size, workers)), Scheduler(max_queue, workers)
    if allow_image_urls and fetcher is None:
        fetcher = ImageFetcher(max_body_bytes)
    budget = ImageBudget(max_image_pixels or settings.max_pixels, max_images, max_total_pixels)
    metrics = Metrics(
        ENDPOINTS,
        {
            "qvl_queue_depth": ("Requests waiting for the generation thread.", lambda: scheduler.waiting),
            "qvl_generations_running": ("Generations in progress.", lambda: scheduler.running),
            "qvl_pooled_sessions": ("Idle sessions kept for reuse.", lambda: len(pool)),
            **_batch_gauges(batcher),
        },
        {**_feature_cache_counters(engine), **_batch_counters(batcher)},
        batch_sizes=batcher.batch_sizes if batcher is not None else None,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if on_ready is not None:
            on_ready()
        yield
        scheduler.close()
        pool.close()

    app = FastAPI(title="qvl-agent", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = Server(
        engine=engine,
        settings=settings,
        model_id=model_id,
        aliases={model_id, os.path.basename(model_id.rstrip("/")), engine.name, DEFAULT_MODEL},
        tokens=tokens,
        pool=pool,
        scheduler=scheduler,
        decoder=ImageDecoder(budget, fetcher if allow_image_urls else None),
        metrics=metrics,
        max_body_bytes=max_body_bytes,
        body_timeout_s=body_timeout_s,
        request_timeout_s=request_timeout_s,
        max_prompt_tokens=max_prompt_tokens,
    )
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.include_router(public)
    app.include_router(protected, dependencies=[Depends(Authenticator(tokens))])
    return app


public = APIRouter()
protected = APIRouter()


def _server(request: Request) -> Server:
    return request.app.state.server


async def _api_error(request: Request, exc: ApiError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    missing = exc.status_code == 404
    err = ApiError(
        exc.status_code, "No such endpoint." if missing else str(exc.detail), code="not_found" if missing else None
    )
    return JSONResponse(err.body(), status_code=exc.status_code)


async def _client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it; it only ends the exchange (nginx's convention)


@public.get("/health")
async def health(request: Request):
    s = _server(request)
    return {"status": "ok", "model": s.model_id, "queue_depth": s.scheduler.waiting, "running": s.scheduler.running}


@public.get("/")
async def chat_page(request: Request):
    s = _server(request)
    web = resources.files("qvl_agent").joinpath("web")
    if s.tokens is not None and user_of(request.query_params.get("token"), s.tokens) is None:
        page = web.joinpath("token.html").read_text(encoding="utf-8")
        return HTMLResponse(page, status_code=401, headers=PAGE_HEADERS)
    return HTMLResponse(web.joinpath("chat.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@protected.get("/v1/models")
async def models(request: Request):
    card = {"id": _server(request).model_id, "object": "model", "created": 0, "owned_by": "qvl-agent"}
    return {"object": "list", "data": [card]}


@protected.get("/metrics")
async def prometheus(request: Request):
    return Response(_server(request).metrics.render(), media_type=CONTENT_TYPE)


@protected.post("/v1/chat/completions")
async def chat_completions(request: Request):
    s = _server(request)
    started = time.perf_counter()
    raw = await read_body(request, s.max_body_bytes, s.body_timeout_s)
    chat = await run_in_threadpool(parse_chat_request, raw, s.settings.max_new_tokens, request.state.user)
    if chat.model and chat.model not in s.aliases:
        raise ApiError(
            404,
            f"The model {chat.model[:100]!r} does not exist here; this server answers with {s.model_id!r} "
            "(see GET /v1/models).",
            param="model",
            code="model_not_found",
        )
    if chat.forced_call and not s.engine.writes_reply_prefix:
        raise ApiError(
            400,
            'tool_choice "required" or a named function needs the local engine, which starts the reply '
            f'with the call; this server runs {s.engine.name[:100]!r}. Use "auto".',
            param="tool_choice",
        )
    if not s.scheduler.reserve():
        retry = s.scheduler.retry_after_s()
        raise ApiError(
            429,
            f"The server is busy ({s.scheduler.max_queue} requests already waiting); retry in {retry} s.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry)},
        )
    try:
        chat = await run_in_threadpool(s.admit, chat)
    except BaseException:
        s.scheduler.release()
        raise
    job = Job(asyncio.get_running_loop(), chat_work(s.engine, s.pool, chat))
    s.scheduler.submit(job)
    reader = Reader(job, request, started + s.request_timeout_s)
    try:
        # Wait for the first piece before answering, so a failure before any output gets its own
        # status code and the headers can say whether a pooled session was reused.
        start = await reader.next()
        first = await reader.next() if start[0] == "start" else start
    except BaseException:
        job.cancel()
        reader.close()
        raise
    reused = start[0] == "start" and bool(start[1]["reused"])
    if first[0] == "error":
        reader.close()
        raise api_error(first[1])
    if chat.stream and chat.response_format == "text":
        return StreamingResponse(
            stream_chunks(chat, s.model_id, job, reader, first, started, s.metrics),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "x-qvl-session-reused": "true" if reused else "false"},
        )
    pieces: list[str] = []
    event = first
    try:
        while event[0] == "delta":
            pieces.append(event[1])
            event = await reader.next()
    except BaseException:
        job.cancel()
        raise
    finally:
        reader.close()
    if event[0] == "error":
        raise api_error(event[1])
    result: ChatResult = event[1]
    s.metrics.observe_generation(time.perf_counter() - started, result.stats, result.reused)
    message, finish = await run_in_threadpool(answer, chat, result.text, result.finish_reason)
    if chat.stream:  # a reply checked whole (response_format) streams once it has passed
        return StreamingResponse(
            replay_chunks(chat, s.model_id, message, finish, result),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **stat_headers(result)},
        )
    usage = usage_dict(result.stats, int(result.stats.get("decode_tokens", 0)))
    body = completion_body(completion_id(), s.model_id, message, finish, usage, qvl_stats(result))
    return JSONResponse(body, headers=stat_headers(result))


def _batch_gauges(batcher) -> dict:
    """The local engine's batch: turns decoding together now and turns waiting for a row."""
    if batcher is None:
        return {}
    return {
        "qvl_batch_decoding": ("Turns in the decode batch now.", lambda: batcher.decoding),
        "qvl_batch_waiting": ("Turns waiting for a row of the decode batch.", lambda: batcher.waiting),
    }


def _batch_counters(batcher) -> dict:
    """Where the batch thread's time went: prefill units and decode steps (the rest it waited for work)."""
    if batcher is None:
        return {}
    return {
        "qvl_batch_prefill_seconds_total": (
            "Seconds the batch thread spent prefilling prompts (a unit's GPU work included).",
            lambda: batcher.prefill_seconds,
        ),
        "qvl_batch_decode_seconds_total": (
            "Seconds the batch thread spent in batched decode steps (the step, the picks, each stream's piece).",
            lambda: batcher.decode_seconds,
        ),
        "qvl_batch_ahead_steps_total": (
            "Batched decode steps launched from the previous step's picks before the host read them.",
            lambda: batcher.ahead_steps,
        ),
    }


def _feature_cache_counters(engine: Engine) -> dict:
    """The local engine's own feature-cache lookups, when it has a cache (remote and replay do not)."""
    cache = getattr(engine, "features", None)
    if cache is None or not hasattr(cache, "hits"):
        return {}
    return {
        "qvl_feature_cache_hits_total": ("Vision feature lookups served from the cache.", lambda: cache.hits),
        "qvl_feature_cache_misses_total": ("Vision feature lookups that ran the vision tower.", lambda: cache.misses),
    }
