"""`qvl-agent serve`: the resident engine behind an OpenAI-compatible API and a chat page.

    qvl-agent serve [--host 127.0.0.1] [--port 8000] [--model ...] [--engine ...] [--no-token | --tokens-file FILE]
                    [--max-batch N]

Prints the model id that requests name, then the chat page's address with its token
(http://127.0.0.1:PORT/?token=TOKEN) once the model is loaded and the port is listening, and last the one
line a script can wait for: `qvl-agent serve: ready on http://127.0.0.1:PORT`. `--port 0` picks a free port
(the printed addresses have the real one). `--tokens-file` gives each user a token of their own; users
never share sessions, KV caches or vision features (nor do requests with different `cache_salt`s).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from qvl_agent.cli import add_engine_args
from qvl_agent.config import DEFAULT_MODEL, MAX_BATCH, Settings, config_dir
from qvl_agent.engine import check_engine
from qvl_agent.errors import UsageError
from qvl_agent.server.listen import DEFAULT_MAX_CONNECTIONS, bind, browser_host, connection_cap, raise_fd_limit


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible API with a chat page",
        description=__doc__.splitlines()[0] + " The API is at /v1/chat/completions, the chat page at /.",
    )
    parser.add_argument("--host", default="127.0.0.1", metavar="HOST", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, metavar="PORT", help="port; 0 picks a free one")
    add_engine_args(parser)
    parser.add_argument(
        "--no-token", action="store_true", help="accept requests without a token (loopback addresses only)"
    )
    parser.add_argument(
        "--tokens-file", metavar="FILE",
        help="one 'NAME TOKEN' per line (a private file): a token per user; users never share sessions, "
        "KV caches, vision features or reuse headers",
    )  # fmt: skip
    parser.add_argument("--max-queue", type=int, default=16, metavar="N", help="requests that may wait before 429")
    parser.add_argument(
        "--max-batch",
        type=int,
        metavar="N",
        help="requests decoding together in one batched step (1: one at a time; default: the max_batch setting, "
        f"{Settings.max_batch})",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, metavar="SECONDS", help="seconds per request before 504"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="open connections at most, kept below the descriptor limit",
    )
    parser.add_argument("--max-body-mb", type=int, default=64, metavar="MIB", help="largest request body in MiB")
    parser.add_argument(
        "--max-image-pixels", type=int, metavar="N", help="largest image in pixels (default: the max_pixels setting)"
    )
    parser.add_argument("--max-images", type=int, default=16, metavar="N", help="images per request before 413")
    parser.add_argument(
        "--max-total-pixels", type=int, default=40_000_000, metavar="N", help="pixels of all images per request"
    )
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=32_768, metavar="N", help="prompt tokens per request before 400"
    )
    parser.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch http(s) image URLs from public addresses (off: data: URLs only)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.server.auth import read_users_file, resolve_token

    for name in ("max_queue", "max_body_mb", "max_images", "max_total_pixels", "max_prompt_tokens", "max_connections"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1.")
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds.")
    if args.max_batch is not None:
        if not 1 <= args.max_batch <= MAX_BATCH:
            raise UsageError(f"--max-batch must be between 1 and {MAX_BATCH}.")
        settings = dataclasses.replace(settings, max_batch=args.max_batch)
    users = None
    if args.tokens_file:
        if args.no_token:
            raise UsageError("--tokens-file gives each user a token; it cannot go with --no-token.")
        users = read_users_file(Path(args.tokens_file))
        token, token_note = None, f"API tokens of {len(users)} users from {args.tokens_file}."
    else:
        token, token_note = resolve_token(settings.api_token, config_dir(), args.host, args.no_token)
    check_engine(settings)  # a bad --engine is its own sentence, never "port busy" nor a load that fails
    sock = bind(args.host, args.port)
    max_connections = connection_cap(args.max_connections, raise_fd_limit())
    # The heavy imports (uvicorn, the engine, torch) only once the flags, the token and the port are known
    # to be good, so a mistake there is reported in a moment.
    import uvicorn

    from qvl_agent.engine import open_engine
    from qvl_agent.server.app import create_app
    from qvl_agent.server.transport import uvicorn_config

    port = sock.getsockname()[1]
    base = f"http://{browser_host(args.host)}:{port}"

    def ready() -> None:
        # Printed once uvicorn accepts requests (and handles Ctrl+C), so the address is live when seen.
        print(token_note, flush=True)
        also = f" ({DEFAULT_MODEL!r} works too)" if settings.model != DEFAULT_MODEL else ""
        print(f"Model id for requests: {settings.model!r}{also}", flush=True)
        print(f"OpenAI-compatible API: {base}/v1", flush=True)
        print(
            f"Chat page: {base}/" + (f"?token={token}" if token else "?token=YOUR_TOKEN" if users else ""), flush=True
        )
        print(f"qvl-agent serve: ready on {base}", flush=True)  # last: a script can wait for this line

    engine = None
    try:
        # Only the local engine loads settings.model; replay:/openai: engines are named by their spec.
        what = f"{settings.model} (local)" if settings.engine == "local" else settings.engine
        print(f"Loading {what}...", file=sys.stderr, flush=True)
        engine = open_engine(settings)
        if settings.engine == "local":
            print(batching_note(engine, settings.max_batch), file=sys.stderr, flush=True)
        app = create_app(
            engine,
            settings,
            token=token,
            users=users,
            max_queue=args.max_queue,
            max_body_bytes=args.max_body_mb * 1024 * 1024,
            max_image_pixels=args.max_image_pixels,
            max_images=args.max_images,
            max_total_pixels=args.max_total_pixels,
            max_prompt_tokens=args.max_prompt_tokens,
            request_timeout_s=args.timeout,
            allow_image_urls=args.allow_image_urls,
            on_ready=ready,
        )
        uvicorn.Server(uvicorn_config(app, max_connections=max_connections, timeout_graceful_shutdown=5)).run(
            sockets=[sock]
        )
    except KeyboardInterrupt:
        pass  # uvicorn re-raises Ctrl+C after its graceful shutdown: stopping a server is success
    finally:
        if engine is not None:
            engine.close()
        sock.close()
    print("Stopped.", file=sys.stderr, flush=True)
    return 0


def batching_note(engine, max_batch: int) -> str:
    """How many requests decode together, and why fewer than asked when memory decided."""
    rows = len(engine.batcher.kv.rows) if getattr(engine, "batcher", None) is not None else 1
    if max_batch == 1:
        return "Batching: off (--max-batch 1): one request generates at a time."
    if rows == 1:
        from qvl_agent.engine.fast_step import supported

        if why := supported(engine.model):
            return f"Batching: off: the batched step does not compute this model's layers exactly ({why})."
        return "Batching: off: batch_memory_mb, or the memory left after loading the model, holds no two rows of KV."
    fewer = f" ({max_batch} asked; batch_memory_mb and the free memory hold {rows})" if rows < max_batch else ""
    return f"Batching: up to {rows} requests decode together{fewer}."
