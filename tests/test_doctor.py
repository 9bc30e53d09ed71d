"""`qvl-agent doctor` as a person runs it: what it finds, the fixes it prints, and its exit code."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.support.paths import path_without


@pytest.fixture
def config_env(tmp_path):
    return {"QVL_CONFIG_DIR": str(tmp_path / "config")}


@pytest.mark.display
def test_all_good_on_a_desktop_with_a_tray_and_a_local_model(x_display, tiny_model_dir, config_env):
    out = run_cli(
        "doctor",
        "--engine",
        "local",
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        env={**config_env, "DISPLAY": x_display, "WAYLAND_DISPLAY": "", "XDG_SESSION_TYPE": "x11"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("display", "system tray", "gpu", "model", "browser", "hotkeys", "script sandbox"):
        assert any(f"  {name}: " in line for line in lines), f"no {name} line in:\n{out.stdout}"
    assert "FAIL" not in out.stdout
    assert f"X11 {x_display}" in out.stdout
    assert str(tiny_model_dir) in out.stdout
    assert "All checks passed." in out.stdout
    # Which wall holds a sandbox's memory here: the test machines run as root with cgroup v1 mounted.
    sandbox = next(line for line in lines if "script sandbox:" in line)
    assert "memory and processes are limited by the kernel (a cgroup v" in sandbox, sandbox


def test_without_a_display_or_a_model_each_problem_gets_a_fix(tmp_path, config_env):
    out = run_cli(
        "doctor",
        "--engine",
        "local",
        "--model",
        str(tmp_path / "missing-model"),
        env={**config_env, "DISPLAY": "", "WAYLAND_DISPLAY": "", "XDG_SESSION_TYPE": ""},
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    text = out.stdout
    assert "FAIL  display: There is no display" in text
    assert "Xvfb :99" in text  # the fix
    assert "FAIL  model:" in text and "no config.json" in text
    fixes = [line for line in text.splitlines() if line.strip().startswith("fix:")]
    assert len(fixes) >= 2
    assert "problem(s): display" in text


def test_a_browser_that_does_not_exist_is_reported(tmp_path, config_env):
    replay = tmp_path / "r.json"
    replay.write_text(json.dumps(["hi"]))
    out = run_cli(
        "doctor",
        "--engine",
        f"replay:{replay}",
        env={**config_env, "DISPLAY": "", "QVL_BROWSER": str(tmp_path / "no-chromium")},
    )
    assert out.returncode == 1
    assert "FAIL  browser:" in out.stdout and "no-chromium" in out.stdout
    assert "ok    model: replay engine" in out.stdout


@pytest.mark.display
def test_wayland_explains_what_works_under_xwayland(x_display, tmp_path, config_env):
    replay = tmp_path / "r.json"
    replay.write_text(json.dumps(["hi"]))
    out = run_cli(
        "doctor",
        "--engine",
        f"replay:{replay}",
        env={**config_env, "DISPLAY": x_display, "WAYLAND_DISPLAY": "wayland-0"},
    )
    assert "XWayland" in out.stdout
    assert "qvl-agent tray --send ask" in out.stdout  # how to get a hotkey anyway
    assert out.returncode == 0, out.stdout  # it works, with limits


def test_wayland_without_xwayland_fails_with_the_reason(tmp_path, config_env):
    out = run_cli(
        "doctor",
        "--engine",
        "replay:/nonexistent.json",
        env={**config_env, "DISPLAY": "", "WAYLAND_DISPLAY": "wayland-0"},
    )
    assert out.returncode == 1
    assert "Wayland session without XWayland" in out.stdout
    assert "enable XWayland" in out.stdout


def test_a_missing_bubblewrap_is_reported_with_the_package_to_install(tmp_path, config_env):
    replay = tmp_path / "r.json"
    replay.write_text("[]")
    env = {**config_env, "PATH": path_without("bwrap", tmp_path), "DISPLAY": ""}
    out = run_cli("doctor", "--engine", f"replay:{replay}", env=env)
    assert out.returncode == 1
    line = next(line for line in out.stdout.splitlines() if "script sandbox:" in line)
    assert line.startswith("FAIL") and "bubblewrap" in line
    assert "fix: apt install bubblewrap" in out.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_remote_engine_fails_and_a_live_one_passes(tmp_path, config_env):
    import http.server
    import threading

    down = run_cli("doctor", "--engine", f"openai:http://127.0.0.1:{_free_port()}", env=config_env)
    assert down.returncode == 1
    assert "FAIL  model: Cannot connect to the model server" in down.stdout and "is it running?" in down.stdout

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            body = json.dumps({"object": "list", "data": [{"id": "qwen-local", "object": "model"}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up = run_cli("doctor", "--engine", f"openai:http://127.0.0.1:{server.server_address[1]}", env=config_env)
    finally:
        server.shutdown()
    assert "ok    model: remote engine" in up.stdout and "serves qwen-local" in up.stdout, up.stdout


def test_an_unknown_engine_is_flagged(config_env):
    out = run_cli("doctor", "--engine", "ollama", env=config_env)
    assert out.returncode == 1
    assert "FAIL  model: unknown engine 'ollama'" in out.stdout and "openai:URL" in out.stdout


def test_the_download_hint_is_a_command_that_exists(tmp_path, config_env):
    out = run_cli("doctor", "--engine", "local", "--model", "someone/not-cached-model",
                  env={**config_env, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert "hf download someone/not-cached-model --local-dir DIR" in out.stdout
    assert "huggingface-cli" not in out.stdout


def test_a_missing_model_names_the_replay_engine_as_the_way_to_try_without_weights(tmp_path, config_env):
    out = run_cli("doctor", "--engine", "local", "--model", "someone/not-cached-model",
                  env={**config_env, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})  # fmt: skip
    fix = next(line for line in out.stdout.splitlines() if "hf download someone/not-cached-model" in line)
    assert "--engine replay:FILE" in fix and "docs/engine.md" in fix
