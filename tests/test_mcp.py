"""`qvl-agent mcp` driven by the official MCP SDK client, as an MCP client application would drive it:
over stdio (the client starts the server) and over streamable HTTP with the bearer token, with the replay
and tiny-model engines, on the virtual display (screen tools) and real Chromium (browse)."""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters
from PIL import Image

from qvl_agent import capture
from qvl_agent.trace import read_trace, run_dirs
from tests.conftest import ROOT, run_cli
from tests.pages.helpers import CHROMIUM, call, click_at, element_centres
from tests.pages.server import PageServer

pytestmark = [pytest.mark.display]
TOKEN = "mcp-test-token-0123456789"  # serve and mcp refuse tokens under 16 characters


def _env(tmp_path: Path, **extra: str) -> dict:
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        XDG_DATA_HOME=str(tmp_path / "data"),  # runs land here, not in the person's data folder
        QVL_CONFIG_DIR=str(tmp_path / "config"),
        QVL_BROWSER=CHROMIUM,
        **extra,
    )


def _replay(tmp_path: Path, replies: list[str]) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(replies), encoding="utf-8")
    return f"replay:{path}"


def _stdio(tmp_path: Path, *args: str) -> Client:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "qvl_agent", "mcp", *args], env=_env(tmp_path), cwd=str(ROOT)
    )
    return Client(params, read_timeout_seconds=240)


def _runs(tmp_path: Path) -> list[Path]:
    return run_dirs(tmp_path / "data" / "qvl-agent" / "runs")


def _pointer() -> tuple[int, int]:
    out = subprocess.run(["xdotool", "getmouselocation"], capture_output=True, text=True, check=True).stdout
    found = dict(part.split(":") for part in out.split() if ":" in part)
    return int(found["x"]), int(found["y"])


def _text(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def test_stdio_every_screen_tool_and_every_refusal(x_display, tmp_path):
    engine = _replay(
        tmp_path,
        [
            "A dark desktop with a tray at the bottom.",  # ask_screen
            call(action="left_click", coordinate=[250, 750]),  # locate
            click_at([500, 500]),  # run_task (dry-run), step 1
            call(action="terminate", status="success"),  # step 2
        ],
    )
    subprocess.run(["xdotool", "mousemove", "17", "23"], check=True)

    async def session():
        async with _stdio(tmp_path, "--engine", engine) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"ask_screen", "locate", "run_task", "browse", "replay", "screenshot"}
            for tool in tools.values():
                assert tool.description and len(tool.description) > 60
                assert tool.input_schema["type"] == "object"
            assert tools["run_task"].input_schema["properties"]["mode"]["enum"] == ["dry-run", "auto"]
            assert tools["ask_screen"].input_schema["required"] == ["question"]

            asked = await client.call_tool("ask_screen", {"question": "What is on the screen?"})
            assert not asked.is_error
            assert _text(asked) == "A dark desktop with a tray at the bottom."
            assert asked.structured_content["stats"]["vision"] == "miss"

            found = await client.call_tool("locate", {"description": "the tray"})
            assert not found.is_error
            assert json.loads(_text(found)) == {"x": 480, "y": 810}  # 250/1000 and 750/1000 of 1920x1080

            shot = await client.call_tool("screenshot", {"monitor": 1})
            image = next(c for c in shot.content if c.type == "image")
            assert image.mime_type == "image/png"
            png = Image.open(io.BytesIO(base64.b64decode(image.data)))
            assert png.size == (1920, 1080)  # full resolution: the client decides whether to scale it
            live = capture.grab(monitor=1)
            mine = png.convert("RGB").tobytes()
            theirs = Image.frombytes("RGB", (live.width, live.height), live.data, "raw", "BGRX").tobytes()
            same = sum(a == b for a, b in zip(mine[::997], theirs[::997], strict=True)) / len(mine[::997])
            assert same > 0.98

            # refusals: each one sentence as a tool error, and the server keeps serving
            before = _runs(tmp_path)
            refused = await client.call_tool("run_task", {"task": "Empty the trash", "mode": "auto"})
            assert refused.is_error and "--allow-actions" in _text(refused)
            assert _runs(tmp_path) == before  # nothing ran, no trace was even started
            for name, args, words in [
                ("run_task", {"task": "Empty the trash", "mode": "yolo"}, "mode"),
                ("ask_screen", {"question": "   "}, "empty"),
                ("ask_screen", {}, "question"),
                ("screenshot", {"monitor": 7}, "no monitor 7"),
                ("locate", {"description": "x", "monitor": -1}, "monitor"),
                ("browse", {"url": "ftp://example.test/", "task": "x"}, "http://"),
                ("ask_screen", {"question": "q", "region": {"x": 1900, "y": 0, "width": 500, "height": 10}}, "outside"),
            ]:
                bad = await client.call_tool(name, args)
                assert bad.is_error, (name, args)
                assert words.lower() in _text(bad).lower(), _text(bad)

            ran = await client.call_tool("run_task", {"task": "Click the middle of the screen"})
            assert not ran.is_error, _text(ran)
            return _text(ran), ran.structured_content

    reply, outcome = anyio.run(session)
    # The calling model reads first that nothing happened, then what would have happened.
    assert reply.startswith("DRY RUN: nothing was clicked or typed on the screen; the task was NOT carried out.")
    assert "dry_run: The model ended the task: success." in reply and "success (dry run)" not in reply
    assert "Would have run (1 action):\n  1. left_click at (500, 500) -> pixel (960, 540)" in reply
    assert outcome["dry_run"] is True
    assert outcome["would_have_run"] == ["left_click at (500, 500) -> pixel (960, 540)"]
    assert outcome["status"] == "dry_run" and outcome["steps"] == 2  # never "success": nothing was done
    trace = read_trace(outcome["trace_dir"])
    assert trace.run["mode"] == "dry-run"
    assert trace.steps[0]["results"][0]["message"] == "not carried out (dry run)"
    assert Path(outcome["report"]).name == "report.html" and Path(outcome["report"]).is_file()
    assert _runs(tmp_path) == [Path(outcome["trace_dir"])]  # `trace list` sees MCP runs too
    assert _pointer() == (17, 23)  # dry-run moved nothing


class HttpServer:
    """`qvl-agent mcp --http 127.0.0.1:0 ARGS` in a subprocess; `url` is the endpoint it printed."""

    def __init__(self, tmp_path: Path, *args: str, token: str | None = TOKEN):
        env = _env(tmp_path, **({"QVL_API_TOKEN": token} if token else {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qvl_agent", "mcp", "--http", "127.0.0.1:0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stderr], daemon=True).start()
        self.printed = []
        while True:
            try:
                line = lines.get(timeout=120)
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"the MCP server printed no endpoint: {self.printed}") from None
            self.printed.append(line)
            found = re.search(r"MCP endpoint: (\S+)", line)
            if found:
                self.url = found.group(1)
                return

    def client(self, token: str | None = TOKEN) -> Client:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=240))
        return Client(streamable_http_client(self.url, http_client=http), read_timeout_seconds=240)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_http_needs_the_token_and_auto_acts_only_with_allow_actions(x_display, tmp_path):
    engine = _replay(
        tmp_path,
        [
            "Just the desktop.",  # ask_screen
            call(action="mouse_move", coordinate=[250, 250]),  # run_task (auto), step 1
            call(action="terminate", status="success"),
        ],
    )
    server = HttpServer(tmp_path, "--engine", engine, "--allow-actions")
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/mcp")
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = httpx.post(server.url, json=hello, headers=headers, timeout=10)
            assert refused.status_code == 401, headers

        subprocess.run(["xdotool", "mousemove", "5", "5"], check=True)

        async def session():
            async with server.client() as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert "run_task" in names and "screenshot" in names
                asked = await client.call_tool("ask_screen", {"question": "What is there?", "monitor": 1})
                assert _text(asked) == "Just the desktop."
                bad = await client.call_tool("run_task", {"task": "x", "max_steps": 0})
                assert bad.is_error
                ran = await client.call_tool("run_task", {"task": "Point at the top left area", "mode": "auto"})
                assert not ran.is_error, _text(ran)
                return ran.structured_content

        outcome = anyio.run(session)
        assert outcome["status"] == "success" and outcome["dry_run"] is False
        assert _pointer() == (480, 270)  # auto really moved the pointer, to 250/1000 of 1920x1080
        assert read_trace(outcome["trace_dir"]).run["mode"] == "auto"
        assert server.proc.poll() is None  # still serving
    finally:
        server.stop()


def test_http_without_allow_actions_refuses_auto_and_keeps_serving(x_display, tmp_path):
    server = HttpServer(tmp_path, "--engine", _replay(tmp_path, ["fine"]))
    try:
        subprocess.run(["xdotool", "mousemove", "40", "40"], check=True)

        async def session():
            async with server.client() as client:
                refused = await client.call_tool("run_task", {"task": "Click OK", "mode": "auto"})
                assert refused.is_error and "--allow-actions" in _text(refused)
                asked = await client.call_tool("ask_screen", {"question": "Still there?"})
                assert _text(asked) == "fine"

        anyio.run(session)
        assert _pointer() == (40, 40) and _runs(tmp_path) == []
    finally:
        server.stop()


@pytest.mark.browser
def test_browse_returns_the_outcome_and_the_exported_script(x_display, tmp_path):
    pages = PageServer().start()
    try:
        url = pages.url + "/login.html"
        at = element_centres(url, ["#username", "#password", "button"])
        engine = _replay(
            tmp_path,
            [
                click_at(at["#username"]),
                call(action="type", text="alice"),
                click_at(at["#password"]),
                call(action="type", text="s3cret"),
                click_at(at["button"]),
                call(action="terminate", status="success"),
            ],
        )

        async def session():
            # The page is on 127.0.0.1: a local address, which browse opens only when the person allows it.
            async with _stdio(tmp_path, "--engine", engine, "--allow-local-urls") as client:
                return await client.call_tool("browse", {"url": url, "task": "Sign in as alice / s3cret"})

        result = anyio.run(session)
        assert not result.is_error, _text(result)
        assert result.structured_content["status"] == "success"
        assert pages.records("login") == [{"username": "alice", "password": "s3cret"}]
        script = result.structured_content["script"]
        assert script in _text(result)
        assert 'get_by_role("textbox", name="Username", exact=True).fill("alice")' in script
        assert "qvl_agent" not in script
        assert Path(result.structured_content["report"]).is_file()
        # Playwright's own trace of the run, beside the report that links it
        trace = zipfile.ZipFile(Path(result.structured_content["trace_dir"]) / "trace.zip").namelist()
        assert {"trace.trace", "trace.network"} <= set(trace)
    finally:
        pages.stop()


def test_engine_openai_shares_a_running_serve(x_display, tmp_path):
    """--engine openai:URL: the MCP server asks a running `qvl-agent serve` instead of loading a model."""
    from tests.support.live_server import start_serve, stop_serve

    served = _replay(tmp_path, ["Answered by the shared server."])
    url, proc, _ = start_serve(
        "--engine", served, config_dir=tmp_path / "serve-config", token="shared-token-0123456789"
    )
    try:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "qvl_agent", "mcp", "--engine", f"openai:{url}/v1"],
            env=_env(tmp_path, QVL_API_KEY="shared-token-0123456789"),
            cwd=str(ROOT),
        )

        async def session():
            async with Client(params, read_timeout_seconds=120) as client:
                return await client.call_tool("ask_screen", {"question": "What is on the screen?"})

        asked = anyio.run(session)
        assert not asked.is_error, _text(asked)
        assert _text(asked) == "Answered by the shared server."
    finally:
        stop_serve(proc)


@pytest.mark.slow
def test_tiny_model_is_loaded_once_and_answers_about_the_screen(x_display, tmp_path, tiny_model_dir):
    region = {"x": 0, "y": 0, "width": 320, "height": 240}

    async def session():
        async with _stdio(tmp_path, "--model", str(tiny_model_dir), "--device", "cpu") as client:
            first = await client.call_tool("ask_screen", {"question": "What is here?", "region": region})
            second = await client.call_tool("ask_screen", {"question": "And now?", "region": region})
            return first, second

    first, second = anyio.run(session)
    assert not first.is_error and not second.is_error, _text(first) + _text(second)
    assert isinstance(first.structured_content["answer"], str)
    assert first.structured_content["stats"]["decode_tokens"] > 0
    # one resident engine: the second call finds the same screen's vision features in its cache
    assert first.structured_content["stats"]["vision"] == "miss"
    assert second.structured_content["stats"]["vision"] == "hit"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--http", "nonsense"], "HOST:PORT"),
        (["--no-token"], "only applies with --http"),
        (["--http", "0.0.0.0:0", "--no-token"], "loopback"),
    ],
)
def test_bad_usage_is_one_sentence_and_exit_2(tmp_path, args, message):
    done = run_cli("mcp", "--engine", "replay:/nonexistent.json", *args, env=_env(tmp_path), timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_bad_engine_is_told_before_a_busy_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli("mcp", "--engine", "openai:ftp://x", "--http", f"127.0.0.1:{port}", env=_env(tmp_path))
        assert done.returncode == 2 and "needs an http:// or https:// URL" in done.stderr, done.stderr
        done = run_cli("mcp", "--engine", "replay:/nonexistent.json", "--http", f"127.0.0.1:{port}", env=_env(tmp_path))
        assert done.returncode == 2 and "/nonexistent.json" in done.stderr and "Cannot listen" not in done.stderr


def test_arguments_that_fail_the_schema_are_one_sentence_naming_the_argument(tmp_path):
    """In process, with the SDK's client: pydantic's several lines and link become one sentence a calling
    model can act on, and the server keeps serving."""
    from qvl_agent.config import Settings
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.mcp_server.server import build_server
    from qvl_agent.mcp_server.tools import ScreenTools

    server = build_server(ScreenTools(ReplayEngine([]), Settings()))

    async def session():
        async with Client(server) as client:
            cases = [
                ("locate", {"description": ["a"]}, "Bad arguments for locate: description: input should be a valid"),
                ("ask_screen", {}, "Bad arguments for ask_screen: question is required."),
                ("ask_screen", {"question": "q", "region": {"x": 0, "y": 0, "width": 0, "height": 9}}, "region.width"),
                ("run_task", {"task": "t", "max_steps": 10**9}, "max_steps: input should be less than or equal"),
            ]
            for name, args, says in cases:
                bad = await client.call_tool(name, args)
                assert bad.is_error, (name, args)
                text = _text(bad)
                assert says in text and "\n" not in text and "pydantic.dev" not in text, text
            listed = await client.list_tools()
            assert len(listed.tools) == 6  # still serving

    anyio.run(session)


def test_an_overlong_question_is_refused_before_the_engine_sees_it(tmp_path):
    from qvl_agent.errors import UsageError
    from qvl_agent.mcp_server.tools import MAX_TEXT_CHARS, _text

    with pytest.raises(UsageError, match="characters long"):
        _text("x" * (MAX_TEXT_CHARS + 1), "question", '"What is this?"')
    assert _text("  What is this?  ", "question", "") == "What is this?"


@pytest.mark.parametrize("max_batch", [16, 1])
def test_questions_from_two_clients_decode_together_with_a_batching_engine(x_display, tiny_model_dir, max_batch):
    """Two `ask_screen` calls at once (two MCP clients, or one beside a run) go through the engine's
    batcher together instead of queueing behind each other; an engine without batching takes them
    one at a time, as before."""
    import time

    from qvl_agent.config import Settings
    from qvl_agent.engine.qwen3vl import Qwen3VLEngine
    from qvl_agent.mcp_server.tools import ScreenTools

    region = capture.Region(0, 0, 320, 240)
    engine = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=Settings(max_batch=max_batch))
    tools = ScreenTools(engine, Settings(max_new_tokens=24))
    results: list[dict] = []

    def ask(question: str) -> None:
        results.append(tools.ask_screen(question, region=region)[1])

    try:
        with engine.lock:  # the model is busy: both questions arrive meanwhile
            threads = [threading.Thread(target=ask, args=(q,)) for q in ("What is here?", "Which window is in front?")]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while engine.batcher is not None and engine.batcher.waiting < 2:
                assert time.monotonic() < deadline, "the questions never reached the batch"
                time.sleep(0.01)
        for t in threads:
            t.join(120)
    finally:
        engine.close()
    assert len(results) == 2
    if max_batch > 1:
        assert all(r["decode_path"] == "batched" and r["decode_batch_max"] == 2 for r in results), results
    else:
        assert all(r["decode_path"] != "batched" for r in results), results
