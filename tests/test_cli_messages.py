"""Small things a new user meets from the command line: the line `serve` prints when it is ready, what
`browse --headed` and `trace report --open` say when there is no display or browser, and the token the serve
benchmark uses. (How `doctor` names the configured engine: tests/test_doctor.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from qvl_agent.trace import TraceWriter
from tests.conftest import ROOT, run_cli
from tests.pages.helpers import call
from tests.support.live_server import stop_serve

NO_DISPLAY = {"DISPLAY": "", "WAYLAND_DISPLAY": "", "XDG_SESSION_TYPE": ""}


def _replay(tmp_path: Path, replies: list[str]) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(replies), encoding="utf-8")
    return f"replay:{path}"


def _serve_bench():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "scripts" / "serve_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_serve_benchmarks_default_token_is_one_serve_accepts(monkeypatch):
    from qvl_agent.server.auth import check_token

    monkeypatch.delenv("QVL_API_TOKEN", raising=False)
    token = _serve_bench().build_parser().parse_args(["--model", "DIR"]).token
    check_token(token, "The benchmark's default token", "pass --token")  # raises ConfigError when too short
    monkeypatch.setenv("QVL_API_TOKEN", "the-persons-own-token-0123")
    assert _serve_bench().build_parser().parse_args([]).token == "the-persons-own-token-0123"


def test_serve_prints_one_ready_line_with_its_url_once_it_listens(tmp_path, monkeypatch):
    """A script can wait for `qvl-agent serve: ready on URL` and use URL at once: the port is the real one
    (--port 0), and the server answers. The token is the serve benchmark's default one."""
    monkeypatch.delenv("QVL_API_TOKEN", raising=False)
    token = _serve_bench().build_parser().parse_args([]).token
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", QVL_CONFIG_DIR=str(tmp_path / "config"))
    env["QVL_API_TOKEN"] = token
    proc = subprocess.Popen(
        [sys.executable, "-m", "qvl_agent", "serve", "--port", "0", "--engine", _replay(tmp_path, ["hi"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    printed: list[str] = []
    ready = None
    try:
        deadline = time.monotonic() + 180
        while ready is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=0.5).rstrip("\n")
            except queue.Empty:
                continue
            printed.append(line)
            ready = re.fullmatch(r"qvl-agent serve: ready on (http://127\.0\.0\.1:(\d+))", line)
        assert ready, "no ready line in:\n" + "\n".join(printed)
        url, port = ready.group(1), int(ready.group(2))
        assert port != 0 and sum("ready on" in line for line in printed) == 1
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert models.status_code == 200, models.text
    finally:
        if proc.poll() is None:
            assert stop_serve(proc) == 0


def test_browse_headed_without_a_display_says_so_in_one_sentence(tmp_path):
    trace_dir = tmp_path / "run"
    env = dict(NO_DISPLAY, XDG_DATA_HOME=str(tmp_path / "data"))
    replay = _replay(tmp_path, [call(action="terminate", status="success")])
    page = (ROOT / "tests" / "pages" / "index.html").as_uri()
    done = run_cli(
        "browse", "--headed", "--url", page, "--engine", replay, "--trace-dir", str(trace_dir), "Look", env=env
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "qvl-agent: --headed shows the browser window, but there is no display here (DISPLAY is not set): "
        "run without --headed to browse headless."
    ]
    assert not trace_dir.exists()  # refused before anything started or was recorded
    # The advice works: the same run without --headed goes ahead on the same display-less machine.
    headless = run_cli("browse", "--url", page, "--engine", replay, "--trace-dir", str(trace_dir), "Look", env=env)
    assert headless.returncode == 0, headless.stderr


def test_trace_report_open_without_a_browser_says_so_and_still_writes_the_report(tmp_path):
    runs = tmp_path / "data" / "qvl-agent" / "runs"
    writer = TraceWriter(runs / "20260101-000000-1")
    writer.start(task="Look", engine="replay", executor="dry-run", mode="dry-run")
    writer.end(status="success", steps=0, message="done")
    writer.close()
    empty = tmp_path / "bin"
    empty.mkdir()  # no xdg-open, www-browser, lynx, ...: nothing webbrowser could start
    env = dict(NO_DISPLAY, XDG_DATA_HOME=str(tmp_path / "data"), PATH=str(empty), BROWSER="")
    done = run_cli("trace", "report", "--open", env=env)
    report = runs / "20260101-000000-1" / "report.html"
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(report) and report.is_file()
    assert done.stderr.strip().splitlines() == [
        f"qvl-agent: no web browser could be started here; open {report} in one yourself."
    ]
