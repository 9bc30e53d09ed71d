"""`qvl-agent run` on a virtual display, from the person's side: system key combinations are not pressed
behind their back, `--yes` needs a working emergency stop, a dry run says so on every line, model text
cannot drive the terminal, and a missing display is explained without pointing at flags `run` lacks."""

from __future__ import annotations

import os
import subprocess

import pytest

from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.test_desktop_e2e import FormApp, call, replay

pytestmark = pytest.mark.display


@pytest.fixture
def form(x_display, tmp_path):
    app = FormApp(tmp_path)
    yield app
    app.close()


def test_with_yes_the_stop_chord_from_the_model_is_refused_and_the_run_goes_on(form, tmp_path):
    # If ctrl+alt+Escape were pressed, the run's own emergency stop would end it as "stopped".
    engine = replay(
        tmp_path, [call(action="key", keys=["ctrl", "alt", "esc"]), call(action="terminate", status="success")]
    )
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(tmp_path / "t"), "Go", input="")
    assert done.returncode == 0, done.stderr
    assert "WARNING: a system key combination" in done.stderr and "Do it? [y/N/q]" in done.stderr
    trace = read_trace(tmp_path / "t")
    assert "was refused" in trace.steps[0]["error"] and "emergency stop" in trace.steps[0]["error"]
    assert "was refused" in trace.steps[1]["observation"]
    assert trace.end["status"] == "success"


def test_allow_keys_lets_the_model_press_it_and_the_stop_fires(form, tmp_path):
    engine = replay(tmp_path, [call(action="key", keys=["ctrl", "alt", "esc"]), call(action="wait", time=30)])
    done = run_cli("run", "--engine", engine, "--yes", "--allow-keys", "--trace-dir", str(tmp_path / "t"), "Go")
    assert done.returncode == 1
    assert read_trace(tmp_path / "t").end["status"] == "stopped"
    assert "Do it?" not in done.stderr


def test_yes_refuses_to_start_without_a_working_emergency_stop(tmp_path):
    # An X server without the RECORD extension: pynput cannot listen, so the stop hotkey cannot work.
    rfd, wfd = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(wfd), "-screen", "0", "800x600x24", "-nolisten", "tcp", "-extension", "RECORD"],
        pass_fds=(wfd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(wfd)
    try:
        with os.fdopen(rfd) as fh:
            display = ":" + fh.readline().strip()
        engine = replay(tmp_path, [call(action="left_click", coordinate=[500, 500])])
        trace_dir = tmp_path / "t"
        args = ("run", "--engine", engine, "--trace-dir", str(trace_dir), "Go")
        done = run_cli(*args[:1], "--yes", *args[1:], env={"DISPLAY": display})
        assert done.returncode == 2, done.stderr
        assert "--yes runs only with a working emergency stop" in done.stderr and "Traceback" not in done.stderr
        assert not trace_dir.exists()  # refused before anything started
        # Without --yes every action is confirmed, so the run may start (and here ends at the empty answer).
        asked = run_cli(*args, env={"DISPLAY": display}, input="")
        assert "Press Ctrl+C here to stop" in asked.stderr and "Do it? [y/n/Q]" in asked.stderr
    finally:
        xvfb.terminate()
        xvfb.wait()


def test_a_dry_run_says_so_in_the_header_and_on_every_action(form, tmp_path):
    engine = replay(
        tmp_path,
        [
            call(action="left_click", coordinate=form.center("name")) + call(action="type", text="nope"),
            call(action="key", keys=["ctrl", "alt", "delete"]),
            call(action="terminate", status="success"),
        ],
    )
    before = form.state()
    done = run_cli("run", "--engine", engine, "--dry-run", "--trace-dir", str(tmp_path / "t"), "Fill it")
    assert done.returncode == 3, done.stderr
    assert "DRY RUN: nothing will be clicked or typed" in done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 4 and all("DRY RUN: " in line for line in steps)
    assert "DRY RUN: dry run finished (nothing was clicked or typed)" in done.stderr
    assert form.state() == before


def test_model_text_cannot_drive_the_terminal(form, tmp_path):
    evil = "done\x1b]0;owned\x07\x1b[2J\rline two\u202e"
    engine = replay(tmp_path, [call(action="key", keys=["\x1b[31m"]), call(action="answer", text=evil)])
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(tmp_path / "t"), "Say it")
    assert done.returncode == 0, done.stderr
    for stream in (done.stdout, done.stderr):
        assert not any(ch in stream for ch in "\x1b\x07\r\u202e")
    assert "done\\x1b]0;owned\\x07\\x1b[2J\\rline two\\u202e" in done.stdout


def test_run_without_a_display_says_so_without_suggesting_image(tmp_path):
    engine = replay(tmp_path, [call(action="terminate", status="success")])
    done = run_cli("run", "--engine", engine, "--yes", "Go", env={"DISPLAY": "", "WAYLAND_DISPLAY": ""})
    assert done.returncode == 2
    assert "DISPLAY is not set" in done.stderr and "--image" not in done.stderr


def test_an_empty_stop_key_in_the_settings_never_switches_the_stop_off(form, tmp_path):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "config.toml").write_text('[hotkeys]\nstop = ""\n')
    engine = replay(tmp_path, [call(action="terminate", status="success")])
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(tmp_path / "t"), "Go",
                   env={"QVL_CONFIG_DIR": str(config_dir)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    notice = next(line for line in done.stderr.splitlines() if "[hotkeys] stop" in line)
    assert "It is ignored" in notice or "it is ignored" in notice
    assert "to stop at any moment" in done.stderr and "press  to stop" not in done.stderr
    assert (config_dir / "config.toml").read_text() == '[hotkeys]\nstop = ""\n'
