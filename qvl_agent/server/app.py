"""An OpenAI-compatible HTTP API over one resident engine, plus a small chat page.

    POST /v1/chat/completions   text and image_url parts (base64 data: URLs), streaming (SSE) or not
    GET  /v1/models             the one model this server answers with
    GET  /health                liveness and queue depth (no token needed)
    GET  /metrics               Prometheus text: requests, latency, ttft, tokens/s, feature cache, queue
    GET  /                      the chat page; opened as /?token=TOKEN, like Jupyter

Every other route needs `Authorization: Bearer TOKEN` unless the server runs without a token. Errors use
OpenAI's JSON shape. Generation runs on one worker thread (`server_worker`); stateless clients reuse
pooled sessions matched by content (`server_pool`), and each response says whether it did: the usage's
`prompt_tokens_details.cached_tokens`, a `qvl` object with the turn's stats, and for non-streaming
replies the headers `x-qvl-vision` (hit|miss|none), `x-qvl-prefill-tokens` and `x-qvl-session-reused`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from qvl_agent.config import Settings
from qvl_agent.engine.base import Engine
from qvl_agent.server.auth import bearer_matches, token_matches
from qvl_agent.server.metrics import Metrics
from qvl_agent.server.pool import SessionPool
from qvl_agent.server.protocol import (
    ApiError,
    ImageDecoder,
    completion_body,
    completion_id,
    parse_chat_request,
    usage_dict,
)
from qvl_agent.server.stream import ClientGone, Reader, api_error, qvl_stats, stat_headers, stream_chunks
from qvl_agent.server.worker import ChatResult, Job, Scheduler, chat_work


def create_app(
    engine: Engine,
    settings: Settings,
    *,
    token: str | None = None,
    model_id: str | None = None,
    max_queue: int = 16,
    max_body_bytes: int = 64 * 1024 * 1024,
    max_image_pixels: int | None = None,
    request_timeout_s: float = 300.0,
    pool_size: int = 8,
    allow_image_urls: bool = False,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """The API app over `engine`. `token=None` disables authentication (the caller checks loopback).
    `on_ready` runs once the server accepts requests (`serve` prints its address then)."""
    model_id = model_id or settings.model
    aliases = {model_id, os.path.basename(model_id.rstrip("/")), engine.name}
    pool = SessionPool(pool_size)
    scheduler = Scheduler(max_queue)
    decoder = ImageDecoder(
        max_image_pixels or settings.max_pixels,
        allow_urls=allow_image_urls,
        fetch=_fetch_image(max_body_bytes) if allow_image_urls else None,
    )
    metrics = Metrics(
        {
            "qvl_queue_depth": ("Requests waiting for the generation thread.", lambda: scheduler.waiting),
            "qvl_generations_running": ("Generations in progress.", lambda: scheduler.running),
            "qvl_pooled_sessions": ("Idle sessions kept for reuse.", lambda: len(pool)),
        },
        _feature_cache_counters(engine),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if on_ready is not None:
            on_ready()
        yield
        scheduler.close()
        pool.close()

    app = FastAPI(title="qvl-agent", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.pool, app.state.scheduler, app.state.metrics = (
        engine,
        pool,
        scheduler,
        metrics,
    )

    def authorize(request: Request) -> None:
        if token is not None and not bearer_matches(request.headers.get("authorization"), token):
            raise ApiError(
                401,
                "Missing or wrong API token: send 'Authorization: Bearer TOKEN' "
                "(qvl-agent serve prints where the token is).",
                type="authentication_error",
                code="invalid_api_key",
            )

    def answer(request: Request, response: Response) -> Response:
        metrics.count_request(request.url.path, response.status_code)
        return response

    @app.exception_handler(ApiError)
    async def api_error_response(request: Request, exc: ApiError):
        return answer(request, JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = "No such endpoint." if exc.status_code == 404 else str(exc.detail)
        err = ApiError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)
        return answer(request, JSONResponse(err.body(), status_code=exc.status_code))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        # Nobody reads this; it only ends the exchange (nginx's "client closed request").
        return answer(request, Response(status_code=499))

    @app.get("/health")
    async def health(request: Request):
        return answer(
            request,
            JSONResponse(
                {
                    "status": "ok",
                    "model": model_id,
                    "queue_depth": scheduler.waiting,
                    "running": scheduler.running,
                }
            ),
        )

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        card = {"id": model_id, "object": "model", "created": 0, "owned_by": "qvl-agent"}
        return answer(request, JSONResponse({"object": "list", "data": [card]}))

    @app.get("/metrics")
    async def prometheus(request: Request):
        authorize(request)
        return answer(request, PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4"))

    @app.get("/")
    async def chat_page(request: Request):
        if token is not None and not token_matches(request.query_params.get("token"), token):
            page = (
                "<!doctype html><title>qvl-agent</title><p>Open the address that <code>qvl-agent serve"
                "</code> printed: it carries the token (<code>/?token=…</code>).</p>"
            )
            return answer(request, HTMLResponse(page, status_code=401))
        html = resources.files("qvl_agent").joinpath("web/chat.html").read_text(encoding="utf-8")
        return answer(
            request,
            HTMLResponse(
                html,
                headers={
                    "Cache-Control": "no-store",
                    "Referrer-Policy": "no-referrer",  # the token is in the URL: never leak it
                    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                    "style-src 'unsafe-inline'; img-src data: blob:; connect-src 'self'",
                },
            ),
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        started = time.perf_counter()
        authorize(request)
        raw = await _read_body(request, max_body_bytes)
        chat = await run_in_threadpool(parse_chat_request, raw, decoder, settings.max_new_tokens)
        if chat.model and chat.model not in aliases:
            raise ApiError(
                404,
                f"The model {chat.model!r} does not exist here; this server answers with "
                f"{model_id!r} (see GET /v1/models).",
                param="model",
                code="model_not_found",
            )
        job = Job(asyncio.get_running_loop(), chat_work(engine, pool, chat))
        if not scheduler.submit(job):
            retry = scheduler.retry_after_s()
            raise ApiError(
                429,
                f"The server is busy ({scheduler.max_queue} requests already waiting); retry in {retry} s.",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry)},
            )
        reader = Reader(job, request, started + request_timeout_s)
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
        if chat.stream:
            body = stream_chunks(chat, model_id, job, reader, first, started, metrics, request)
            return StreamingResponse(
                body,
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
        metrics.observe_generation(time.perf_counter() - started, result.stats, result.reused)
        body = completion_body(
            completion_id(),
            model_id,
            result.text,
            result.finish_reason,
            usage_dict(result.stats, int(result.stats.get("decode_tokens", 0))),
            qvl_stats(result),
        )
        return answer(request, JSONResponse(body, headers=stat_headers(result)))

    return app


def _feature_cache_counters(engine: Engine) -> dict:
    """The local engine's own feature-cache lookups, when it has a cache (remote and replay do not)."""
    cache = getattr(engine, "features", None)
    if cache is None or not hasattr(cache, "hits"):
        return {}
    return {
        "qvl_feature_cache_hits_total": ("Vision feature lookups served from the cache.", lambda: cache.hits),
        "qvl_feature_cache_misses_total": (
            "Vision feature lookups that ran the vision tower.",
            lambda: cache.misses,
        ),
    }


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    too_big = ApiError(
        413, f"The request body is over this server's limit of {limit:,} bytes.", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _fetch_image(limit: int):
    """A fetcher for http(s) image URLs, used only when the server was started with them allowed."""

    def fetch(url: str) -> bytes:
        import httpx

        try:
            with httpx.stream("GET", url, timeout=10.0, follow_redirects=True) as response:
                response.raise_for_status()
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise ApiError(413, f"The image at {url} is over {limit:,} bytes.", code="image_too_large")
                return bytes(data)
        except httpx.HTTPError as exc:
            raise ApiError(400, f"Could not fetch the image at {url} ({exc}).", code="image_fetch_failed") from None

    return fetch
