"""`qvl-agent doctor` as a person runs it: what it finds, the fixes it prints, and its exit code.

Doctor reports every problem of a machine in one run, so the tests that look for different problems of one
machine read the same run (a module fixture): one on a machine with no display (a Wayland session without
XWayland), no browser and no bubblewrap, one with a model that is not downloaded, one with a model server
that is down."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import run_cli
from tests.support.paths import path_without

SECRET_KEY = "sk-secret-do-not-print"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def config_env(tmp_path):
    return {"QVL_CONFIG_DIR": str(tmp_path / "config")}


@pytest.fixture(scope="module")
def broken_machine(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
    """(the replay engine, doctor's run) on a Wayland session without XWayland, with QVL_BROWSER naming a
    browser that does not exist and no bubblewrap on PATH."""
    folder = tmp_path_factory.mktemp("broken-machine")
    replay = folder / "r.json"
    replay.write_text(json.dumps(["hi"]))
    env = {
        "QVL_CONFIG_DIR": str(folder / "config"),
        "DISPLAY": "",
        "WAYLAND_DISPLAY": "wayland-0",
        "QVL_BROWSER": str(folder / "no-chromium"),
        "PATH": path_without("bwrap", folder),
    }
    return f"replay:{replay}", run_cli("doctor", "--engine", f"replay:{replay}", env=env)


@pytest.fixture(scope="module")
def not_downloaded(tmp_path_factory) -> subprocess.CompletedProcess:
    """doctor for a Hugging Face model id that is not in the cache, with no network, on device auto."""
    folder = tmp_path_factory.mktemp("not-downloaded")
    env = {"QVL_CONFIG_DIR": str(folder / "config"), "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1",
           "QVL_DEVICE": "auto"}  # fmt: skip
    return run_cli("doctor", "--engine", "local", "--model", "someone/not-cached-model", env=env)


@pytest.fixture(scope="module")
def server_down(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
    """(the URL, doctor's run) for a remote engine, with an API key, whose server is not running."""
    url = f"http://127.0.0.1:{_free_port()}/v1"
    env = {"QVL_CONFIG_DIR": str(tmp_path_factory.mktemp("server-down") / "config"), "QVL_API_KEY": SECRET_KEY}
    return url, run_cli("doctor", "--engine", f"openai:{url}", "--model", "served-model", env=env)


def _engine_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if "  engine: " in line)


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
    assert _engine_line(out.stdout) == f"ok    engine: local model folder {tiny_model_dir} on device cpu"
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


def test_a_browser_that_does_not_exist_is_reported(broken_machine):
    _, out = broken_machine
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


def test_wayland_without_xwayland_fails_with_the_reason(broken_machine):
    _, out = broken_machine
    assert out.returncode == 1
    assert "Wayland session without XWayland" in out.stdout
    assert "enable XWayland" in out.stdout


def test_a_missing_bubblewrap_is_reported_with_the_package_to_install(broken_machine):
    _, out = broken_machine
    assert out.returncode == 1
    line = next(line for line in out.stdout.splitlines() if "script sandbox:" in line)
    assert line.startswith("FAIL") and "bubblewrap" in line
    assert "fix: apt install bubblewrap" in out.stdout


def test_an_unreachable_remote_engine_fails_and_a_live_one_passes(server_down, config_env):
    import http.server
    import threading

    _, down = server_down
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


def test_the_download_hint_is_a_command_that_exists(not_downloaded):
    assert "hf download someone/not-cached-model --local-dir DIR" in not_downloaded.stdout
    assert "huggingface-cli" not in not_downloaded.stdout


def test_a_missing_model_names_the_replay_engine_as_the_way_to_try_without_weights(not_downloaded):
    fix = next(line for line in not_downloaded.stdout.splitlines() if "hf download someone/not-cached-model" in line)
    assert "--engine replay:FILE" in fix and "docs/engine.md" in fix


def test_doctor_describes_the_configured_engine(broken_machine, not_downloaded, server_down):
    """The `engine:` line names what the model commands will use, and never the API key (a local model
    folder's line is checked in the all-good test)."""
    replay, out = broken_machine
    path = replay.removeprefix("replay:")
    assert _engine_line(out.stdout) == f"ok    engine: replay file {path} (recorded replies, no model)"

    line = _engine_line(not_downloaded.stdout)
    assert "local model someone/not-cached-model on device auto" in line and "CPU" in line

    url, out = server_down
    assert _engine_line(out.stdout) == (
        f"ok    engine: remote OpenAI-compatible server {url}, model served-model, with an API key"
    )
    assert SECRET_KEY not in out.stdout + out.stderr
