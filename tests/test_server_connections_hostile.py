"""Connection floods against a live `qvl-agent serve` on 127.0.0.1, started as a person would but under a
low descriptor limit: hundreds of half-open request heads do not starve `/health` or an ordinary request,
and the server's stderr stays a few lines (the old server failed every accept() and wrote a traceback
for each, megabytes in seconds). The soft descriptor limit is raised to the hard one at start."""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import subprocess
import sys

import httpx
import pytest

from qvl_agent.server.listen import connection_cap
from qvl_agent.server.transport import RateLimit
from tests.conftest import ROOT

GENEROUS_S = 60.0  # a client-side timeout only: a starved server never answers at all


def start(tmp_path, soft: int, hard: int, *flags: str):
    """`qvl-agent serve` (replay engine, no token) with RLIMIT_NOFILE set to (soft, hard) in the child;
    (process, base URL, stderr path)."""
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["still here"] * 20))
    err_path = tmp_path / "serve.err"
    env = dict(os.environ, QVL_CONFIG_DIR=str(tmp_path / "config"), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.pop("QVL_API_TOKEN", None)
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "qvl_agent", "serve", "--port", "0", "--no-token", "--engine", f"replay:{replies}",
             *flags],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        )  # fmt: skip
    for line in proc.stdout:
        if line.startswith("OpenAI-compatible API: "):
            return proc, line.split(": ", 1)[1].strip().removesuffix("/v1"), err_path
    proc.wait(30)
    raise AssertionError(f"serve did not start: {err_path.read_text()}")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def half_open_heads(url: str, count: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(5)
        try:
            sock.connect((host, int(port)))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Wait: ")  # the head never ends
        except OSError:
            pass  # the server may already have closed it to make room: the flood goes on
        socks.append(sock)
    return socks


@pytest.fixture()
def soft_limit_raised():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2_000 < hard or soft < 2_000 and hard == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4_096, hard))  # the test itself holds ~1,000 sockets
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
def test_hundreds_of_half_open_heads_under_a_low_descriptor_limit_do_not_starve_health(tmp_path, soft_limit_raised):
    proc, url, err_path = start(tmp_path, 512, 512)
    socks: list[socket.socket] = []
    try:
        socks = half_open_heads(url, 700)  # more than the server has descriptors
        health = httpx.get(url + "/health", timeout=GENEROUS_S)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        body = {"messages": [{"role": "user", "content": "are you there?"}]}
        ordinary = httpx.post(url + "/v1/chat/completions", json=body, timeout=GENEROUS_S)
        assert ordinary.status_code == 200, ordinary.text
        assert ordinary.json()["choices"][0]["message"]["content"] == "still here"
        # Room was made by closing the oldest waiting heads, while the flood still held its sockets.
        closed = sum(1 for sock in socks[:100] if _closed_by_server(sock))
        assert closed > 0
    finally:
        for sock in socks:
            sock.close()
        stop(proc)
    log = err_path.read_text(errors="replace")
    assert "Traceback" not in log and "Too many open files" not in log
    assert len(log) < 20_000, log[-3000:]  # a few lines a minute, not a traceback per accept()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start(tmp_path):
    proc, url, _ = start(tmp_path, 256, 2048)
    try:
        assert httpx.get(url + "/health", timeout=GENEROUS_S).status_code == 200
        limits = (f"/proc/{proc.pid}/limits", "Max open files")
        line = next(ln for ln in open(limits[0]).read().splitlines() if ln.startswith(limits[1]))
        assert line.split()[3:5] == ["2048", "2048"]
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("wanted", "fd_limit", "cap"),
    [(1000, 1024, 864), (1000, 512, 352), (1000, 1_048_576, 1000), (50, 1024, 50), (1000, 100, 8), (1000, None, 1000)],
)
def test_the_connection_cap_keeps_descriptors_free(wanted, fd_limit, cap):
    assert connection_cap(wanted, fd_limit) == cap


def test_a_flood_of_one_log_message_is_a_few_lines_then_a_count():
    now = [0.0]
    limit = RateLimit(burst=5, period_s=60, clock=lambda: now[0])
    records = [
        logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "accept failed", None, None) for _ in range(1000)
    ]
    kept = [r for r in records if limit.filter(r)]
    assert len(kept) == 5
    now[0] = 61.0
    late = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "accept failed", None, None)
    assert limit.filter(late) and late.getMessage() == "accept failed (995 more like this in the last 60 s left out)"
    other = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "something else", None, None)
    assert limit.filter(other)
