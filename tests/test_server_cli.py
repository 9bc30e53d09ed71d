"""`qvl-agent serve` as a command: where its token comes from, what it refuses, and how it stops."""

from __future__ import annotations

import json
import socket
import stat

import httpx

from tests.conftest import run_cli
from tests.support.live_server import start_serve, stop_serve


def replay_file(tmp_path, replies=("First answer.", "Second answer.")):
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(list(replies)))
    return f"replay:{path}"


def test_token_is_created_once_with_mode_0600_and_printed_in_the_page_address(tmp_path):
    config = tmp_path / "config"
    spec = replay_file(tmp_path)
    url, proc, printed = start_serve("--engine", spec, config_dir=config, token=None)
    try:
        assert f"Loading {spec}..." in printed  # the engine that answers, not a model it never loads
        token_file = config / "api_token"
        assert f"API token created in {token_file} (mode 0600)." in printed
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert f"Chat page: {url}/?token={token}" in printed
        assert httpx.get(url + "/v1/models").status_code == 401
        r = httpx.post(
            url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.json()["choices"][0]["message"]["content"] == "First answer."
    finally:
        assert stop_serve(proc) == 0
    url, proc, printed = start_serve("--engine", replay_file(tmp_path), config_dir=config, token=None)
    try:
        assert f"API token read from {token_file} (mode 0600)." in printed
        assert f"?token={token}" in printed[-1]
    finally:
        assert stop_serve(proc) == 0


def test_token_from_the_environment_wins(tmp_path):
    url, proc, printed = start_serve("--engine", replay_file(tmp_path), config_dir=tmp_path, token="env-token")
    try:
        assert "API token from QVL_API_TOKEN." in printed
        assert not (tmp_path / "api_token").exists()
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer env-token"}).status_code == 200
    finally:
        assert stop_serve(proc) == 0


def test_no_token_only_on_loopback(tmp_path):
    result = run_cli(
        "serve",
        "--host",
        "0.0.0.0",
        "--no-token",
        "--engine",
        replay_file(tmp_path),
        env={"QVL_CONFIG_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "--no-token is only allowed on a loopback address" in result.stderr
    assert "Traceback" not in result.stderr

    url, proc, printed = start_serve("--no-token", "--engine", replay_file(tmp_path), config_dir=tmp_path, token=None)
    try:
        assert printed[-1] == f"Chat page: {url}/"
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
    finally:
        assert stop_serve(proc) == 0


def test_a_busy_port_and_bad_flags_are_one_sentence(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "serve",
            "--port",
            str(port),
            "--engine",
            replay_file(tmp_path),
            env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": "t"},
        )
    assert result.returncode == 2
    assert f"Cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("serve", "--port", "70000", env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": "t"})
    assert result.returncode == 2 and "--port must be from 0 to 65535" in result.stderr
    result = run_cli("serve", "--engine", "openai:ftp://x", env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": "t"})
    assert result.returncode == 2 and "needs an http:// or https:// URL" in result.stderr
