"""Confirm mode (`qvl-agent run` without --yes) driven as a person would, on a virtual display with the
real test form: the terminal shows the model's words and the action, a marker ring shows the point on the
screen while it asks (and is gone before the click and from the next screenshot), what cannot be done is
refused before asking, "n" goes back to the model and "q" ends the run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

from qvl_agent.image import to_pixels
from qvl_agent.trace import read_trace
from tests.conftest import ROOT
from tests.support.tray import geometry, visible_windows
from tests.test_desktop_e2e import FormApp, call, replay

pytestmark = [pytest.mark.display]
MARKER_TITLE = "^qvl-agent marker$"
MARKER_RED = (230, 30, 30)


@pytest.fixture
def app(x_display, tmp_path):
    form = FormApp(tmp_path)
    yield form
    form.close()


class Terminal:
    """`qvl-agent run` with a pipe for its input and everything it prints collected."""

    def __init__(self, engine: str, trace_dir):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qvl_agent", "run", "--engine", engine, "--trace-dir", str(trace_dir), "Fill it"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.out = b""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while chunk := os.read(self.proc.stdout.fileno(), 4096):
            self.out += chunk

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")

    def wait_prompts(self, count: int, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while self.text.count("Do it?") < count:
            assert self.proc.poll() is None or self.text.count("Do it?") >= count, self.text
            assert time.monotonic() < deadline, f"no prompt number {count}; printed:\n{self.text}"
            time.sleep(0.05)
        return self.text

    def answer(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()


def test_confirm_shows_words_and_marker_refuses_the_impossible_first_n_tells_the_model_q_ends(app, tmp_path, x_display):
    name = app.center("name")
    engine = replay(
        tmp_path,
        [
            "Thought: the name field is empty, so I click it.\n"
            + call(action="left_click", coordinate=name)
            + call(action="type", text="Ada"),
            call(action="key", keys=["nosuchkey"]),
            call(action="left_click", coordinate=app.checkbox()),
            "The person did not want the box ticked; I submit instead.\n"
            + call(action="left_click", coordinate=app.center("submit")),
        ],
    )
    trace_dir = tmp_path / "trace"
    run = Terminal(engine, trace_dir)
    try:
        printed = run.wait_prompts(1)
        assert "the model says:\n    Thought: the name field is empty, so I click it." in printed
        assert "<tool_call>" not in printed
        # The point is ringed on the screen while the question waits.
        px, py = to_pixels(*name, app.screen)
        # The action in words, with its pixel: the same sentence the tray's confirm dialog shows.
        assert f"qvl-agent: it will click at pixel ({px}, {py}) (marked on the screen)." in printed
        deadline = time.monotonic() + 10
        while not (markers := visible_windows(x_display, MARKER_TITLE)):
            assert time.monotonic() < deadline, "no marker on the screen while asking"
            time.sleep(0.05)
        x, y, w, h = geometry(x_display, markers[0])
        assert (x + w // 2, y + h // 2) == (px, py)
        run.answer("y")
        run.wait_prompts(2)  # the typing: no point, no marker
        assert not visible_windows(x_display, MARKER_TITLE)
        run.answer("y")
        app.wait_state(lambda s: s["name"] == "Ada")
        # The key that does not exist is refused without asking: the next prompt is the checkbox's.
        printed = run.wait_prompts(3)
        assert printed.count("Do it?") == 3 and "Unknown key 'nosuchkey'" in printed
        run.answer("n")
        printed = run.wait_prompts(4)
        assert "The person did not want the box ticked" in printed
        run.answer("q")
        assert run.proc.wait(60) == 1
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    state = app.state()
    assert state["name"] == "Ada" and state["agree"] is False and state["submitted"] == []
    assert "The person ended the run" in run.text
    steps = read_trace(trace_dir).steps
    assert len(steps) == 4
    assert "The person declined left_click" in steps[3]["observation"]  # "n" went back to the model
    # The marker was gone before the click and is not in the screenshot taken after it.
    shot = Image.open(trace_dir / steps[1]["screenshot"]).convert("RGB")
    ring = [shot.getpixel((px + dx, py + dy)) for dx in range(-24, 25) for dy in range(-24, 25)]
    assert MARKER_RED not in ring
