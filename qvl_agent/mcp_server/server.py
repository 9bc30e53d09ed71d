"""The MCP server: `ScreenTools` as MCP tools on the official SDK, over stdio or streamable HTTP.

Each tool has a JSON schema (from the type hints and `Field` descriptions) and a description written for
the calling model. A mistake the caller can fix (an empty question, a monitor that does not exist, mode
auto on a server started without --allow-actions) comes back as a tool error with one sentence; the SDK
does the same for arguments that fail the schema; the server keeps serving either way. Tools run in
worker threads, so a long run never blocks the protocol (pings, listing, a screenshot meanwhile).

Over HTTP every request needs `Authorization: Bearer TOKEN`, the token resolved exactly as for
`qvl-agent serve` (`server/auth.py`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Annotated, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from qvl_agent import __version__
from qvl_agent.errors import QvlError
from qvl_agent.image import Region
from qvl_agent.mcp_server.tools import ScreenTools
from qvl_agent.server.auth import bearer_matches
from qvl_agent.server.listen import DEFAULT_MAX_CONNECTIONS

INSTRUCTIONS = (
    "qvl-agent sees this computer's real screen through a local vision-language model (Qwen3-VL). "
    "Use screenshot to look yourself, ask_screen to have the local model answer about the screen, locate to "
    "get the pixel position of an element, run_task to let it carry out a desktop task step by step "
    "(dry-run by default: it only says what it would do), and browse to do a task on a web page in a fresh "
    "headless browser and get back a Playwright script that replays it, and replay to run such a script in a "
    "sandbox (with heal=true the local model repairs steps the page's changes broke)."
)


class ScreenRegion(BaseModel):
    """A rectangle of the desktop in physical pixels."""

    x: int = Field(description="left edge, in desktop pixels")
    y: int = Field(description="top edge, in desktop pixels")
    width: int = Field(ge=1, description="width in pixels")
    height: int = Field(ge=1, description="height in pixels")


Monitor = Annotated[
    int | None,
    Field(ge=0, description="which monitor: 1 = the first (default), 2 = the second, ...; 0 = all monitors as one"),
]


async def _call(fn: Callable, *args):
    """Run a blocking tool in a worker thread; a QvlError becomes a tool error the caller can read."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except QvlError as exc:
        raise ToolError(str(exc)) from None


def _result(text: str, data: dict) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def argument_error(tool: str, exc: ValidationError) -> str:
    """One sentence for arguments that fail a tool's schema, naming the argument (pydantic's own text is
    several lines with a link, which a calling model reads worse)."""
    errors = exc.errors(include_url=False)
    error = max(errors, key=lambda e: len(e["loc"]))  # the deepest location is the most specific
    # Union members show up in the location by their type name ("int", "ScreenRegion"): not arguments.
    path = ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and p[:1].isupper() or p in _TYPES))
    given = repr(error.get("input"))
    given = given if len(given) <= 60 else given[:57] + "..."
    message = error["msg"][0].lower() + error["msg"][1:]
    where = f"{path}: " if path else ""
    more = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    if error["type"] == "missing":
        return f"Bad arguments for {tool}: {path or 'an argument'} is required{more}."
    return f"Bad arguments for {tool}: {where}{message}, not {given}{more}."


_TYPES = {"int", "str", "float", "bool", "none", "list", "dict", "literal"}


class _Server(MCPServer):
    """The SDK's server, with schema failures said in one sentence."""

    async def call_tool(self, name, arguments, context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(argument_error(name, exc.__cause__)) from None
            raise


def flat(doc: str | None) -> str:
    """A docstring as one line of text, its line breaks and indentation runs turned into single spaces."""
    return " ".join((doc or "").split())


def build_server(tools: ScreenTools) -> MCPServer:
    """The MCP server with the six tools on `tools`."""
    mcp = _Server("qvl-agent", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def tool(annotations: ToolAnnotations):
        # The docstring as one flat paragraph: the calling model should not read the source's indentation.
        return lambda fn: mcp.tool(description=flat(fn.__doc__), annotations=annotations)(fn)

    @tool(read_only)
    async def ask_screen(
        question: Annotated[str, Field(description="the question about what is on the screen now")],
        monitor: Monitor = None,
        region: Annotated[ScreenRegion | None, Field(description="look only at this rectangle")] = None,
    ) -> CallToolResult:
        """Capture the screen now and have the local vision model answer a question about it (what is shown,
        what a dialog says, which button does what). Returns the answer as text; the structured result adds
        `stats` (time to first token, tokens, whether the vision features were cached)."""
        area = Region(region.x, region.y, region.width, region.height) if region else None
        answer, stats = await _call(tools.ask_screen, question, monitor, area)
        return _result(answer, {"answer": answer, "stats": stats})

    @tool(read_only)
    async def locate(
        description: Annotated[str, Field(description='the element to find, e.g. "the Save button"')],
        monitor: Monitor = None,
    ) -> CallToolResult:
        """Find one element on the screen and return where it is: {"x", "y"} in physical desktop pixels
        (what a click at that element would use), plus the model's 0-1000 answer and the time it took."""
        found = await _call(tools.locate, description, monitor)
        return _result(json.dumps({"x": found["x"], "y": found["y"]}), found)

    @tool(ToolAnnotations(destructive_hint=True, open_world_hint=False))
    async def run_task(
        task: Annotated[str, Field(description="what to do on the desktop, in words")],
        mode: Annotated[
            Literal["dry-run", "auto"],
            Field(
                description="dry-run (default): only say what would be done; auto: really click and type "
                "(only when the server was started with --allow-actions)"
            ),
        ] = "dry-run",  # fmt: skip
        max_steps: Annotated[int, Field(ge=1, le=100, description="give up after this many steps")] = 30,
    ) -> CallToolResult:
        """Carry out a task on the first monitor, step by step: screenshot, the local model picks an action,
        a safety guard checks it, then it is done (auto) or only described (dry-run). Returns the outcome
        (status success/failure/stopped/limit/error, or dry_run for a dry run the model ended as done; message,
        answer, steps) and the run's trace folder with its report.html; a dry run says so (`dry_run`) and lists
        the actions it would have run (`would_have_run`), none of which happened."""
        outcome = await _call(tools.run_task, task, mode, max_steps)
        return _result(outcome.text(), outcome.as_dict())

    @tool(ToolAnnotations(destructive_hint=False, open_world_hint=True))
    async def browse(
        url: Annotated[
            str,
            Field(
                description="the page to start on: an http:// or https:// address of a public web site "
                "(file:// and local addresses only when the server allows local URLs)"
            ),
        ],
        task: Annotated[str, Field(description="what to do on the page, in words")],
        max_steps: Annotated[int, Field(ge=1, le=100, description="give up after this many steps")] = 30,
    ) -> CallToolResult:
        """Carry out a task on a web page in a fresh, headless Chromium (nothing on the desktop is touched).
        Returns the outcome and, when the run succeeded, the text of a standalone Playwright script that
        replays it without the model. A dialog the page opens (alert, confirm, prompt) is answered by the
        model, never accepted unasked, and recorded; the script answers exactly that dialog and fails on
        any other."""
        outcome, script = await _call(tools.browse, url, task, max_steps)
        data = outcome.as_dict() | {"script": script}
        text = f"{outcome.status}: {outcome.message}\nTrace: {outcome.trace_dir}"
        content = [TextContent(type="text", text=text)]
        if script:
            content.append(TextContent(type="text", text=script))
        return CallToolResult(content=content, structured_content=data)

    @tool(ToolAnnotations(destructive_hint=False, open_world_hint=True))
    async def replay(
        script: Annotated[str, Field(description="the text of a saved Playwright script, e.g. as browse returned it")],
        heal: Annotated[
            bool,
            Field(
                description="repair steps whose locator broke (the page changed) with the local model, and return "
                "the healed script"
            ),
        ] = False,  # fmt: skip
        timeout: Annotated[float, Field(gt=0, le=3600, description="end the run after this many seconds")] = 300,
    ) -> CallToolResult:
        """Run a saved Playwright script in qvl-agent's sandbox (network only to the origins in its header, a
        fresh headless Chromium, its files into a new folder). With heal, a step that fails because the page
        changed (renamed button, moved field, new ids, a banner in the way) is located again by the local
        model from a screenshot and the step's intent, and the run goes on; every heal is listed, and when the
        run reaches its end the healed script (which replays without the model) and its diff come back. A heal
        the model is unsure of stops the run with one sentence (`stopped`)."""
        out = await _call(tools.replay, script, heal, timeout)
        lines = [f"exit status {out['exit_status']}"]
        lines += [f"healed line {h['line']}: {h['failing']} -> {h['locator']}" for h in out["heals"] if h["locator"]]
        if out["stopped"]:
            lines.append(out["stopped"])
        content = [TextContent(type="text", text="\n".join(lines) + "\n" + out["output"])]
        if out["healed_script"]:
            content.append(TextContent(type="text", text=out["healed_script"]))
        return CallToolResult(content=content, structured_content=out, is_error=out["exit_status"] != 0)

    @tool(read_only)
    async def screenshot(monitor: Monitor = None) -> list:
        """The monitor's screen as a full-resolution PNG image (scale it down yourself if you need to),
        with a line giving its size and position on the desktop."""
        png, shot = await _call(tools.screenshot, monitor)
        where = f"{shot.width}x{shot.height} pixels at ({shot.left}, {shot.top}) of the desktop"
        return [Image(data=png, format="png"), where]

    return mcp


class BearerAuth:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer TOKEN` (401 otherwise)."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.token is not None:
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if not bearer_matches(header, self.token):
                body = json.dumps({"error": "A valid Authorization: Bearer TOKEN header is required."}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def serve_http(
    mcp: MCPServer,
    sock: socket.socket,
    host: str,
    token: str | None,
    on_ready: Callable[[], None],
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Serve streamable HTTP at /mcp on an already bound socket until Ctrl+C, with `serve`'s transport:
    request-head timeouts, at most `max_connections` open, rate-limited logs."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from qvl_agent.server.transport import uvicorn_config

    # The SDK's DNS-rebinding check allows only loopback Host headers unless told otherwise; a server bound
    # to another address is reached by that address, and the bearer token is what guards it there.
    security = None
    if host not in ("127.0.0.1", "localhost", "::1"):
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = BearerAuth(mcp.streamable_http_app(transport_security=security, host=host), token)

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            on_ready()

    config = uvicorn_config(app, max_connections=max_connections, timeout_graceful_shutdown=5, lifespan="on")
    _Server(config).run(sockets=[sock])
