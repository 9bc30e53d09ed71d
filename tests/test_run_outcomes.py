"""Every run folder says how the run ended, as the person sees it in the terminal, `trace list`, `trace show`
and report.html: a dry run never reads as a done task and lists the actions it only showed; Ctrl+C in the
middle of `run` or `browse` leaves an "interrupted" run with its report; a `browse` whose start page cannot
be opened leaves a "failed to start" run with its report instead of an empty folder; a step that reused the
screen grabbed while the last one settled says "capture reused" instead of "capture 0 ms"."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qvl_agent.trace import read_trace
from tests.conftest import ROOT, run_cli
from tests.pages.helpers import CHROMIUM, call
from tests.pages.server import PageServer


def _replay(tmp_path: Path, replies: list[str]) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(replies), encoding="utf-8")
    return f"replay:{path}"


def _env(tmp_path: Path) -> dict:
    # runs land in this test's own data folder, so `trace list` lists this test's runs only
    return {
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "QVL_CONFIG_DIR": str(tmp_path / "config"),
        "QVL_BROWSER": CHROMIUM,
    }


def _listed(tmp_path: Path) -> list[str]:
    listed = run_cli("trace", "list", env=_env(tmp_path))
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.splitlines()


def _interrupt_mid_run(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """Start `qvl-agent ARGS` in a session of its own, wait until it prints its first step, then press
    Ctrl+C as a terminal does: SIGINT to the whole process group (Chromium and Playwright's driver too)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **_env(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qvl_agent", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        # A terminal's foreground program gets Ctrl+C: a pytest-xdist worker ignores SIGINT, and a child
        # would inherit that (Python then never raises KeyboardInterrupt).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = b""
    try:
        deadline = time.monotonic() + 180
        while b"step 1:" not in seen and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                seen += os.read(proc.stdout.fileno(), 4096)
        assert b"step 1:" in seen, "the run never reached its first step: " + proc.stderr.read().decode()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, (seen + out).decode(), err.decode()


def _assert_interrupted(tmp_path: Path, trace_dir: Path, code: int, err: str) -> None:
    assert code == 130, err
    assert "Traceback" not in err
    trace = read_trace(trace_dir)
    assert trace.end is not None and trace.end["status"] == "interrupted", trace.end
    assert len(trace.steps) == 1  # the step Ctrl+C cut short is recorded too
    report = (trace_dir / "report.html").read_text(encoding="utf-8")
    assert "<th>Outcome</th><td>interrupted" in report and ": Interrupted (Ctrl+C) in step 1." in report
    assert f"report: {trace_dir / 'report.html'}" in err
    [line] = [line for line in _listed(tmp_path) if line.startswith(trace_dir.name)]
    assert "interrupted" in line and "unfinished" not in line


@pytest.mark.display
def test_a_dry_run_is_called_one_everywhere_with_what_it_would_have_run(x_display, tmp_path):
    engine = _replay(
        tmp_path,
        [
            call(action="left_click", coordinate=[500, 500]) + call(action="type", text="hello"),
            call(action="terminate", status="success"),
        ],
    )
    trace_dir = tmp_path / "data" / "qvl-agent" / "runs" / "dry"
    done = run_cli(
        "run", "--engine", engine, "--dry-run", "--trace-dir", str(trace_dir), "Say hello", env=_env(tmp_path)
    )
    assert done.returncode == 3, done.stderr  # its own exit status: neither done (0) nor failed (1)
    assert "dry run finished (nothing was clicked or typed): The model ended the task: success." in done.stderr
    assert "success (" not in done.stderr
    assert "Would have run (2 actions):\n  1. left_click at (500, 500) -> pixel (960, 540)\n  2. type 'hello'" in (
        done.stderr
    )

    [line] = [line for line in _listed(tmp_path) if line.startswith("dry ")]
    assert " dry_run " in line and "success" not in line and "Say hello" in line

    shown = run_cli("trace", "show", str(trace_dir), env=_env(tmp_path)).stdout
    assert "(dry run: nothing was clicked or typed)" in shown
    assert "end      dry_run after 2 steps" in shown
    assert "would do 1. left_click at (500, 500) -> pixel (960, 540)" in shown and "2. type 'hello'" in shown

    report = (trace_dir / "report.html").read_text(encoding="utf-8")
    assert "<title>qvl-agent dry run: Say hello</title>" in report
    assert '<header class="dry">' in report
    assert "dry run finished (nothing was clicked or typed)" in report and "success (" not in report
    assert "1. left_click at (500, 500) -&gt; pixel (960, 540); 2. type &#x27;hello&#x27;" in report


@pytest.mark.display
def test_ctrl_c_in_the_middle_of_a_desktop_run_leaves_an_interrupted_run_with_its_report(x_display, tmp_path):
    engine = _replay(tmp_path, [call(action="wait", time=60), call(action="terminate", status="success")])
    trace_dir = tmp_path / "data" / "qvl-agent" / "runs" / "cut"
    code, out, err = _interrupt_mid_run(
        tmp_path, "run", "--engine", engine, "--dry-run", "--trace-dir", str(trace_dir), "Wait"
    )
    _assert_interrupted(tmp_path, trace_dir, code, err)
    assert "interrupted (dry run, nothing was clicked or typed)" in err


@pytest.mark.browser
def test_ctrl_c_in_the_middle_of_a_browser_run_leaves_an_interrupted_run_with_its_report(tmp_path):
    server = PageServer().start()
    try:
        engine = _replay(tmp_path, [call(action="wait", time=60), call(action="terminate", status="success")])
        trace_dir = tmp_path / "data" / "qvl-agent" / "runs" / "cut"
        args = ("browse", "--url", f"{server.url}/index.html", "--engine", engine, "--trace-dir", str(trace_dir))
        code, out, err = _interrupt_mid_run(tmp_path, *args, "--export", str(tmp_path / "out.py"), "Wait")
    finally:
        server.stop()
    _assert_interrupted(tmp_path, trace_dir, code, err)
    assert not (tmp_path / "out.py").exists()


@pytest.mark.browser
def test_a_start_page_that_cannot_be_opened_leaves_a_failed_run_with_its_report(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    engine = _replay(tmp_path, [call(action="terminate", status="success")])
    trace_dir = tmp_path / "data" / "qvl-agent" / "runs" / "dead"
    done = run_cli(
        "browse", "--url", url, "--engine", engine, "--trace-dir", str(trace_dir), "Sign in", env=_env(tmp_path)
    )
    assert done.returncode == 1, done.stderr
    assert f"The page {url} could not be opened" in done.stderr and "Traceback" not in done.stderr
    trace = read_trace(trace_dir)
    assert trace.run["task"] == "Sign in"
    assert trace.end["status"] == "failed to start" and "could not be opened" in trace.end["message"]
    report = (trace_dir / "report.html").read_text(encoding="utf-8")
    assert "failed to start: The page" in report
    [line] = [line for line in _listed(tmp_path) if line.startswith("dead ")]
    assert "0 steps  failed to start" in line and "Sign in" in line and "unfinished" not in line


@pytest.mark.display
def test_a_step_on_the_screen_the_last_one_settled_on_says_capture_reused(x_display, tmp_path):
    engine = _replay(
        tmp_path, [call(action="mouse_move", coordinate=[100, 100]), call(action="terminate", status="success")]
    )
    trace_dir = tmp_path / "t"
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(trace_dir), "Move", env=_env(tmp_path))
    assert done.returncode == 0, done.stderr
    trace = read_trace(trace_dir)
    assert "capture" not in trace.steps[0] and trace.steps[1]["capture"] == "reused"
    report = (trace_dir / "report.html").read_text(encoding="utf-8")
    step2 = report[report.index('id="step-2"') :]
    assert "capture reused" in step2[:400] and "capture 0 ms" not in step2[:400]
    shown = run_cli("trace", "show", str(trace_dir), env=_env(tmp_path)).stdout
    assert shown.count("capture reused") == 1


def test_the_tray_s_sentence_about_a_dry_run_does_not_read_as_a_done_task():
    from qvl_agent.agent import RunResult
    from qvl_agent.ui.automation import describe_outcome

    real = RunResult("success", steps=2, message="The model ended the task: success.")
    dry = RunResult("dry_run", steps=2, message="The model ended the task: success.", dry_run=True)
    assert describe_outcome(real).startswith("Task done")
    assert describe_outcome(dry).startswith("Dry run finished, nothing was clicked or typed")


@pytest.mark.parametrize("problem", ["missing", "not json", "not a list"])
def test_a_bad_replay_file_is_one_sentence_before_any_run_folder(tmp_path, problem):
    replies = tmp_path / "replies.json"
    if problem != "missing":
        replies.write_text("{nope" if problem == "not json" else '{"a": 1}', encoding="utf-8")
    script = tmp_path / "saved.py"
    script.write_text("print('hi')\n", encoding="utf-8")
    engine = f"replay:{replies}"
    commands = {
        "run": ("run", "--engine", engine, "--dry-run", "--trace-dir", str(tmp_path / "run-dir"), "Save"),
        "browse": ("browse", "--url", "https://x.test/", "--engine", engine, "--trace-dir", f"{tmp_path}/b-dir", "A"),
        "replay": ("replay", str(script), "--heal", "--engine", engine, "--trace-dir", str(tmp_path / "heal-dir")),
        "browse, default folder": ("browse", "--url", "https://example.com/", "--engine", engine, "Sign in"),
    }
    for name, args in commands.items():
        done = run_cli(*args, env=_env(tmp_path))
        assert done.returncode == 2, (name, done.stderr)
        said = done.stderr.strip().splitlines()
        assert len(said) == 1 and "replay file" in said[0] and str(replies) in said[0], (name, said)
    assert not any(tmp_path.glob("*-dir")), "a run folder was made before the error"
    assert not (tmp_path / "data" / "qvl-agent" / "runs").exists()
    assert _listed(tmp_path)[0].startswith("No runs")


@pytest.mark.browser
def test_trace_list_shows_runs_made_with_trace_dir_by_their_path_and_skips_deleted_ones(tmp_path):
    server = PageServer().start()
    try:
        engine = _replay(tmp_path, [call(action="terminate", status="success")])
        url = f"{server.url}/index.html"
        elsewhere = tmp_path / "my runs" / "first"
        gone = tmp_path / "my runs" / "second"
        for folder, task in ((elsewhere, "Look elsewhere"), (gone, "Then delete me"), (None, "Look at home")):
            where = ("--trace-dir", str(folder)) if folder else ()
            done = run_cli("browse", "--url", url, "--engine", engine, *where, task, env=_env(tmp_path))
            assert done.returncode == 0, done.stderr
    finally:
        server.stop()
    shutil.rmtree(gone)
    lines = _listed(tmp_path)
    assert len(lines) == 2, lines
    assert "Look at home" in lines[0] and not lines[0].startswith("/")  # newest first, by its folder name
    assert lines[1].startswith(f"{elsewhere} ") and "Look elsewhere" in lines[1] and "success" in lines[1]


def test_the_tray_lists_a_long_dry_run_s_first_actions_and_points_to_the_report_for_the_rest():
    from qvl_agent.agent import RunResult
    from qvl_agent.ui.automation import describe_outcome

    would_do = tuple(f"left_click at ({i}, {i}) -> pixel ({i}, {i})" for i in range(1, 21))
    dry = RunResult("dry_run", steps=21, message="The model ended the task: success.", dry_run=True, would_do=would_do)
    lines = describe_outcome(dry).splitlines()
    assert lines[1] == "Would have run (20 actions):"
    assert lines[2:10] == [f"  {i}. {what}" for i, what in enumerate(would_do[:8], start=1)]
    assert lines[10:] == ["  … and 12 more (Open report lists them all)."]
