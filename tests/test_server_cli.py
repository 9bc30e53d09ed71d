"""`qvl-agent serve` as a command: where its token comes from, what it refuses, and how it stops."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

import httpx

from tests.conftest import run_cli
from tests.support.live_server import start_serve, stop_serve

LONG_TOKEN = "a-token-of-sixteen-or-more"


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
        assert "Model id for requests: 'Qwen/Qwen3-VL-2B-Instruct'" in printed
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
    url, proc, printed = start_serve(
        "--engine", replay_file(tmp_path), config_dir=tmp_path, token="env-token-0123456789"
    )
    try:
        assert "API token from QVL_API_TOKEN." in printed
        assert not (tmp_path / "api_token").exists()
        assert (
            httpx.get(url + "/v1/models", headers={"Authorization": "Bearer env-token-0123456789"}).status_code == 200
        )
    finally:
        assert stop_serve(proc) == 0


def test_a_replay_engine_answers_without_loading_torch(tmp_path):
    """Only a local model needs torch: a server in front of recorded replies (or of another server) starts
    and answers in a moment. Checked on the running process, after it has answered."""
    url, proc, _ = start_serve("--engine", replay_file(tmp_path), config_dir=tmp_path, token=LONG_TOKEN)
    try:
        r = httpx.post(
            url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {LONG_TOKEN}"},
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.json()["choices"][0]["message"]["content"] == "First answer."
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()
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
            env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": LONG_TOKEN},
        )
        assert result.returncode == 2
        assert f"Cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
        result = run_cli(
            "serve",
            "--port",
            str(port),
            "--engine",
            "openai:ftp://x",
            env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": LONG_TOKEN},
        )
        # A bad flag is told before the port is tried: its own sentence, even where the port is busy.
        assert result.returncode == 2 and "needs an http:// or https:// URL" in result.stderr, result.stderr
    result = run_cli("serve", "--port", "70000", env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": LONG_TOKEN})
    assert result.returncode == 2 and "--port must be from 0 to 65535" in result.stderr


def test_a_token_file_readable_by_others_is_made_private_with_a_notice(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    token_file = config / "api_token"
    token_file.write_text("a-shared-token-0123456789\n")
    token_file.chmod(0o644)
    url, proc, printed = start_serve("--engine", replay_file(tmp_path), config_dir=config, token=None)
    try:
        assert f"The API token file {token_file} was readable by others (mode 0644); changed it to 0600." in printed
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer a-shared-token-0123456789"}).is_success
    finally:
        assert stop_serve(proc) == 0


def test_a_symlinked_short_or_foreign_token_file_is_refused(tmp_path):
    import os

    secret = tmp_path / "secret.txt"
    secret.write_text("not-a-token-but-private-data\n")
    secret.chmod(0o640)
    cases = {
        "link": (lambda f: f.symlink_to(secret), "is a symbolic link"),
        "short": (lambda f: f.write_text("x\n"), "is 1 characters long; use at least 16"),
        "foreign": (
            lambda f: (f.write_text("a-foreign-token-0123456789"), os.chown(f, 4242, -1)),
            "belongs to another user",
        ),
    }
    for name, (make, expected) in cases.items():
        config = tmp_path / name
        config.mkdir()
        make(config / "api_token")
        result = run_cli("serve", "--engine", replay_file(tmp_path), env={"QVL_CONFIG_DIR": str(config)})
        assert result.returncode == 2, (name, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr, (name, result.stderr)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o640  # the link's target was not touched
    result = run_cli(
        "serve", "--engine", replay_file(tmp_path), env={"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": "short"}
    )
    assert result.returncode == 2 and "QVL_API_TOKEN is 5 characters long" in result.stderr


def test_a_token_file_that_is_a_folder_a_fifo_binary_or_has_spaces_is_one_sentence(tmp_path):
    import os

    cases = {
        "folder": (lambda f: f.mkdir(), "is not a regular file"),
        "fifo": (lambda f: os.mkfifo(f, 0o600), "is not a regular file"),
        "binary": (lambda f: f.write_bytes(b"\xff\xfe\x00" + b"a" * 30), "is not text"),
        "spaces": (lambda f: f.write_text("a token with spaces in it\n"), "holds spaces"),
    }
    for name, (make, expected) in cases.items():
        config = tmp_path / name
        config.mkdir()
        make(config / "api_token")
        result = run_cli("serve", "--engine", replay_file(tmp_path), env={"QVL_CONFIG_DIR": str(config)}, timeout=60)
        assert result.returncode == 2, (name, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr, (name, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)
    env = {"QVL_CONFIG_DIR": str(tmp_path), "QVL_API_TOKEN": "ünïcode-token-0123456789"}
    result = run_cli("serve", "--engine", replay_file(tmp_path), env=env)
    assert result.returncode == 2 and "QVL_API_TOKEN holds spaces, control or non-ASCII" in result.stderr
    assert "delete the file" not in result.stderr
