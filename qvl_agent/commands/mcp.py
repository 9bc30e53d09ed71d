"""`qvl-agent mcp`: the screen, the desktop agent and the browser agent as tools for any MCP client.

    qvl-agent mcp [--model ...] [--engine ...] [--allow-actions] [--allow-local-urls]
                  [--http HOST:PORT [--no-token]]

Over stdio by default (the client starts this command); `--http HOST:PORT` serves streamable HTTP at
http://HOST:PORT/mcp instead, with the same bearer token as `qvl-agent serve`. The engine is loaded once
(`--engine openai:URL` shares a running `qvl-agent serve`). Tools: ask_screen, locate, run_task (dry-run;
auto only with --allow-actions), browse, screenshot. browse visits public web sites only (no file://
URL, no localhost or private address, not even through a link or redirect) unless --allow-local-urls.
Messages go to stderr: stdout is the protocol's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from qvl_agent.cli import add_engine_args
from qvl_agent.config import Settings, config_dir
from qvl_agent.engine import check_engine
from qvl_agent.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("mcp", help="serve the screen and the agents as MCP tools", description=__doc__.splitlines()[0])
    add_engine_args(p)
    p.add_argument(
        "--allow-actions", action="store_true", help="let run_task act for real (mode auto); off: dry-run only"
    )
    p.add_argument(
        "--allow-local-urls",
        action="store_true",
        help="let browse open file:// URLs and localhost or private addresses (off: public web sites only)",
    )
    p.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    p.add_argument("--no-token", action="store_true", help="with --http: no bearer token (loopback addresses only)")
    p.add_argument("--browser", metavar="FILE", help="Chromium for browse (default: $QVL_BROWSER, or find one)")
    p.set_defaults(func=run)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--http takes HOST:PORT, e.g. 127.0.0.1:8765 (port 0 picks a free one), not {text!r}.")
    return host, int(port)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.server.auth import resolve_token
    from qvl_agent.server.listen import DEFAULT_MAX_CONNECTIONS, bind, browser_host, connection_cap, raise_fd_limit

    if args.no_token and not args.http:
        raise UsageError("--no-token only applies with --http (stdio needs no token).")
    address = _host_port(args.http) if args.http else None
    token = None
    if address:
        token, token_note = resolve_token(settings.api_token, config_dir(), address[0], args.no_token)
    check_engine(settings)  # a bad --engine is its own sentence, never "port busy" nor a load that fails
    sock = bind(*address) if address else None  # a busy port fails before the model loads
    # The MCP SDK and the engine only once the flags, the token and the port are known to be good, so a mistake
    # there is reported in a moment.
    from qvl_agent.engine import open_engine
    from qvl_agent.mcp_server.server import build_server, serve_http
    from qvl_agent.mcp_server.tools import ScreenTools

    what = f"{settings.model} (local)" if settings.engine == "local" else settings.engine
    _say(f"Loading {what}...")
    engine = None
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the protocol: nothing else may reach it
            engine = open_engine(settings)
        tools = ScreenTools(
            engine,
            settings,
            allow_actions=args.allow_actions,
            browser=args.browser,
            allow_local_urls=args.allow_local_urls,
        )
        mcp = build_server(tools)
        actions = "run_task may act (auto)" if args.allow_actions else "run_task is dry-run only"
        if sock is None:
            _say(f"MCP server on stdio; {actions}.")
            mcp.run("stdio")
        else:
            host = address[0]
            base = f"http://{browser_host(host)}:{sock.getsockname()[1]}/mcp"
            cap = connection_cap(DEFAULT_MAX_CONNECTIONS, raise_fd_limit())
            serve_http(mcp, sock, host, token, lambda: _say(f"{token_note}\nMCP endpoint: {base} ({actions})"), cap)
    except KeyboardInterrupt:
        pass
    finally:
        if engine is not None:
            engine.close()
        if sock is not None:
            sock.close()
    _say("Stopped.")
    return 0
