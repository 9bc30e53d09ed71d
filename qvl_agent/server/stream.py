"""Waiting on a generation and answering with it: a deadline, a client that goes away, SSE chunks.

`Reader` takes a job's events one at a time, raising 504 past the request's deadline and cancelling the
job when the client disconnects while it waits. `stream_chunks` turns the events into OpenAI's SSE
chunks, tool calls included (`tools.ToolCallStream`); `answer` makes a whole reply OpenAI's assistant
message, and `replay_chunks` streams one that had to be checked whole first (`response_format`).
`api_error` maps a failure from the generation thread to the error the client sees.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import Request

from qvl_agent.errors import GenerationCancelled, InputError, QvlError
from qvl_agent.server import structured
from qvl_agent.server.metrics import Metrics
from qvl_agent.server.protocol import ApiError, ChatRequest, chunk_body, completion_id, sse, usage_dict
from qvl_agent.server.tools import ToolCallStream, parse_reply
from qvl_agent.server.transport import ClientGone
from qvl_agent.server.worker import ChatResult, Job

log = logging.getLogger("qvl_agent.server")
POLL_S = 0.25  # how often a waiting handler checks whether its client is still there


class Reader:
    """Reads a job's events with a deadline, noticing a client that went away while it waits."""

    def __init__(self, job: Job, request: Request, deadline: float):
        self.job, self.request, self.deadline = job, request, deadline
        self._task: asyncio.Future | None = None
        self._checked = time.perf_counter()

    async def next(self, watch_client: bool = True):
        while True:
            remaining = self.deadline - time.perf_counter()
            if remaining <= 0:
                self.job.cancel()
                raise ApiError(
                    504,
                    "The answer took longer than this server's request timeout; it was stopped.",
                    type="timeout_error",
                    code="timeout",
                )
            # Check the client every POLL_S even while pieces keep arriving faster than that.
            if watch_client and time.perf_counter() - self._checked >= POLL_S:
                self._checked = time.perf_counter()
                if await self.request.is_disconnected():
                    self.job.cancel()
                    raise ClientGone()
            if self._task is None:
                self._task = asyncio.ensure_future(self.job.events.get())
            # asyncio.wait, unlike wait_for on 3.11, never loses an item that arrives as the wait ends.
            done, _ = await asyncio.wait({self._task}, timeout=min(remaining, POLL_S))
            if done:
                task, self._task = self._task, None
                return task.result()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


async def stream_chunks(
    chat: ChatRequest,
    model_id: str,
    job: Job,
    reader: Reader,
    first,
    started: float,
    metrics: Metrics,
):
    """SSE chunks: the role, each piece, the finish with stats, usage if asked, then [DONE]. Starlette
    cancels this generator when the client disconnects; `finally` then stops the generation."""
    cid = completion_id()
    finished = False
    calls = ToolCallStream(chat.tool_names, chat.single_tool_call) if chat.tool_names else None
    try:
        yield sse(chunk_body(cid, model_id, {"role": "assistant", "content": ""}))
        event = first
        while event[0] == "delta":
            for delta in calls.push(event[1]) if calls else [{"content": event[1]}]:
                yield sse(chunk_body(cid, model_id, delta))
            try:
                event = await reader.next(watch_client=False)
            except ApiError as exc:
                event = ("error", exc)
        if event[0] == "error":
            yield sse(api_error(event[1]).body())
        else:
            result: ChatResult = event[1]
            for delta in calls.flush() if calls else []:
                yield sse(chunk_body(cid, model_id, delta))
            usage = usage_dict(result.stats, int(result.stats.get("decode_tokens", 0)))
            finish = "tool_calls" if calls and calls.called else result.finish_reason
            yield sse(chunk_body(cid, model_id, {}, finish, qvl=qvl_stats(result)))
            if chat.include_usage:
                yield sse(chunk_body(cid, model_id, None, usage=usage))
            metrics.observe_generation(time.perf_counter() - started, result.stats, result.reused)
        yield sse("[DONE]")
        finished = True
    finally:
        reader.close()
        if not finished:
            job.cancel()


async def replay_chunks(chat: ChatRequest, model_id: str, message: dict, finish: str, result: ChatResult):
    """A reply that had to be complete before it could be sent (a checked `response_format`), as SSE
    chunks: the role, the content or the calls, the finish with stats, usage if asked, then [DONE]."""
    cid = completion_id()
    yield sse(chunk_body(cid, model_id, {"role": "assistant", "content": ""}))
    if message.get("content"):
        yield sse(chunk_body(cid, model_id, {"content": message["content"]}))
    for index, call in enumerate(message.get("tool_calls") or ()):
        yield sse(chunk_body(cid, model_id, {"tool_calls": [{"index": index, **call}]}))
    yield sse(chunk_body(cid, model_id, {}, finish, qvl=qvl_stats(result)))
    if chat.include_usage:
        usage = usage_dict(result.stats, int(result.stats.get("decode_tokens", 0)))
        yield sse(chunk_body(cid, model_id, None, usage=usage))
    yield sse("[DONE]")


def answer(chat: ChatRequest, text: str, finish: str) -> tuple[dict, str]:
    """The reply as OpenAI's assistant message, and its finish reason: the model's tool calls when it
    made valid ones (`tool_calls`), else its text, checked against a JSON `response_format` unless cut
    short by the length limit (422 when it does not match)."""
    if chat.tool_names:
        content, calls = parse_reply(text, chat.tool_names)
        if calls:
            calls = calls[:1] if chat.single_tool_call else calls
            return {"role": "assistant", "content": content, "tool_calls": [c.wire() for c in calls]}, "tool_calls"
    if chat.response_format != "text" and finish != "length":
        text = structured.check_reply(text, chat.response_format, chat.schema)
    return {"role": "assistant", "content": text}, finish


def qvl_stats(result: ChatResult) -> dict:
    return {**result.stats, "session_reused": result.reused, "queue_ms": round(result.queue_ms, 3)}


def stat_headers(result: ChatResult) -> dict[str, str]:
    return {
        "x-qvl-vision": str(result.stats.get("vision", "none")),
        "x-qvl-prefill-tokens": str(int(result.stats.get("prefill_tokens", 0))),
        "x-qvl-cached-tokens": str(int(result.stats.get("cached_tokens", 0))),
        "x-qvl-session-reused": "true" if result.reused else "false",
        # how many streams decoded together with this one, on average per step (1: alone)
        "x-qvl-decode-batch": str(result.stats.get("decode_batch", 1.0)),
    }


def api_error(exc: BaseException) -> ApiError:
    """The client's view of a failure inside the generation thread."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, GenerationCancelled):
        return ApiError(499, "The request was cancelled.", type="cancelled", code="cancelled")
    if isinstance(exc, InputError):
        return ApiError(400, str(exc), code="invalid_input")
    if isinstance(exc, QvlError):
        return ApiError(500, str(exc), type="server_error", code="engine_error")
    log.error("generation failed", exc_info=exc)
    return ApiError(
        500,
        f"The model failed unexpectedly ({type(exc).__name__}: {exc}).",
        type="server_error",
        code="internal_error",
    )
