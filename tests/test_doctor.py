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
