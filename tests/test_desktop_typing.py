"""Typed text arrives exactly as the model wrote it: every printable ASCII character, accented letters and
an emoji, typed by the real `qvl-agent run` into a real Qt text field on the virtual display and read back
from the widget; the step reports how many characters were typed."""

from __future__ import annotations

import os
import shutil
import string

import pytest

from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.support.display import display_works
from tests.test_desktop_e2e import FormApp, call, replay

pytestmark = [
    pytest.mark.display,
    pytest.mark.skipif(
        not shutil.which("Xvfb") and not display_works(os.environ.get("DISPLAY", "")),
        reason="needs Xvfb (apt install xvfb jwm xdotool) or a live X display",
    ),
]

ASCII = "".join(chr(c) for c in range(0x20, 0x7F))  # space to tilde: every printable ASCII character
TEXT = ASCII + " éüñß ÉÜÑ 😀 a<b>c"


@pytest.fixture
def app(x_display, tmp_path):
    form = FormApp(tmp_path)
    yield form
    form.close()


def test_every_character_typed_arrives_in_the_widget_unchanged(app, tmp_path):
    assert set(string.punctuation) <= set(TEXT)
    engine = replay(
        tmp_path,
        [
            call(action="left_click", coordinate=app.center("name")) + call(action="type", text=TEXT),
            call(action="left_click", coordinate=app.center("email")) + call(action="type", text="a<b>c"),
            call(action="key", keys=["<"]) + call(action="key", keys=["é"]),  # one character pressed as a key
            call(action="terminate", status="success"),
        ],
    )
    trace_dir = tmp_path / "trace"
    done = run_cli("run", "--engine", engine, "--yes", "--trace-dir", str(trace_dir), "Type it")
    assert done.returncode == 0, done.stderr
    state = app.wait_state(lambda s: s["email"] == "a<b>c<é")
    assert state["name"] == TEXT
    trace = read_trace(trace_dir)
    messages = [r["message"] for s in trace.steps for r in s["results"]]
    assert f"typed {len(TEXT)} characters" in messages and "typed 5 characters" in messages


def test_a_text_cut_short_types_nothing_more_and_the_keyboard_map_is_given_back(x_display):
    """An emergency stop between two characters: nothing after it is typed, and the spare keys the
    keyboard map lent for characters it lacks are empty again once the executor closes."""
    from qvl_agent import actions as A
    from qvl_agent.act.desktop import DesktopExecutor
    from qvl_agent.act.x11_typing import X11Input, XTestTypist
    from qvl_agent.errors import EmergencyStop
    from qvl_agent.image import Screenshot

    pressed: list[int] = []

    class Recording(XTestTypist):
        def _press(self, code, shift):
            pressed.append(code)

    def keymap(typist) -> list[tuple[int, ...]]:
        d = typist._display
        first = d.display.info.min_keycode
        return [tuple(row) for row in d.get_keyboard_mapping(first, d.display.info.max_keycode - first + 1)]

    checks = iter(range(100))

    def interrupt():
        if next(checks) == 3:
            raise EmergencyStop("stop")

    typist = Recording()
    before = keymap(typist)
    executor = DesktopExecutor(input_backend=X11Input(None, typist), interrupt=interrupt, platform="linux")
    with pytest.raises(EmergencyStop):
        executor.execute(A.Type(text="€😀ŁŒxyz"), Screenshot(b"\0" * 4, 1, 1, "BGRA"))
    assert len(pressed) == 3
    assert keymap(typist) != before  # three keysyms the map lacked were lent keys
    executor.close()
    assert keymap(typist) == before
