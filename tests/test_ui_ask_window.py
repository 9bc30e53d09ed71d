"""The ask window offscreen (pytest-qt): streaming, Markdown, follow-ups on one session, buttons, cancel."""

from __future__ import annotations

import threading

import pytest

from qvl_agent.capture import Screenshot  # noqa: E402
from qvl_agent.engine.base import GenerationOptions  # noqa: E402
from qvl_agent.engine.replay import ReplayEngine  # noqa: E402


@pytest.fixture(scope="session")
def qapp_args():
    # Offscreen: real widgets with no display; a session started on a display keeps its platform.
    return ["qvl-agent-tests", "-platform", "offscreen"]


def make_shot(width=320, height=200, color=(30, 120, 200)) -> Screenshot:
    b, g, r = color[2], color[1], color[0]
    return Screenshot(bytes([b, g, r, 0]) * (width * height), width, height, "BGRA", source="test")


@pytest.fixture
def host(qtbot):
    from PySide6.QtWidgets import QApplication
    from shiboken6 import isValid

    from qvl_agent.ui.engine_worker import EngineHost

    h = EngineHost()
    yield h
    for widget in QApplication.topLevelWidgets():
        if isValid(widget) and widget.isVisible():
            widget.close()  # the ask window deletes itself on close
    h.close()


def load(qtbot, host, engine):
    with qtbot.waitSignal(host.ready, timeout=60_000):
        host.load(lambda: engine)


def open_window(qtbot, host, shot=None, **kw):
    from qvl_agent.ui.ask_window import AskWindow

    events = []
    win = AskWindow(host, shot or make_shot(), on_event=lambda name, **data: events.append((name, data)), **kw)
    win.show()
    return win, events


def ask(qtbot, win, text, timeout=60_000):
    win.question.setText(text)
    with qtbot.waitSignal(win.host.answered, timeout=timeout):
        win.question.returnPressed.emit()


def test_answer_streams_as_markdown_and_follow_up_reuses_session(qtbot, host):
    engine = ReplayEngine(["The window shows **two buttons**: OK and Cancel.", "The OK button is on the left."])
    load(qtbot, host, engine)
    win, events = open_window(qtbot, host)
    assert win.windowTitle().startswith("qvl-agent")
    assert not win.thumbnail.pixmap().isNull()

    pieces = []
    host.piece.connect(lambda _req, piece: pieces.append(piece))
    ask(qtbot, win, "What is on screen?")
    qtbot.waitUntil(lambda: "two buttons" in win.answer_view.toPlainText())
    assert len(pieces) > 3  # arrived piece by piece, not in one block
    # Rendered as Markdown: the bold text is bold, not asterisks.
    assert "**" not in win.answer_view.toPlainText()
    assert "font-weight:700" in win.answer_view.toHtml().replace(" ", "")
    assert "vision features computed" in win.status.text()
    assert "first token" in win.status.text()

    ask(qtbot, win, "Which one is on the left?")
    qtbot.waitUntil(lambda: "OK button is on the left" in win.answer_view.toPlainText())
    # Both turns went to one session, and only the first carried the screenshot.
    assert len({r.session_id for r in engine.requests}) == 1
    assert [len(r.image_hashes) for r in engine.requests] == [1, 0]
    assert "reused from the first question" in win.status.text()
    done = [d for name, d in events if name == "answer_done"]
    assert [d["text"] for d in done] == engine.replies


def test_copy_button_puts_the_answer_on_the_clipboard(qtbot, host):
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication

    load(qtbot, host, ReplayEngine(["Press `Ctrl+S` to save."]))
    win, _ = open_window(qtbot, host)
    assert not win.copy_button.isEnabled()
    ask(qtbot, win, "How do I save?")
    qtbot.waitUntil(win.copy_button.isEnabled)
    qtbot.mouseClick(win.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "Press `Ctrl+S` to save."


def test_stop_cancels_a_running_answer_and_the_window_keeps_working(qtbot, host):
    from PySide6.QtCore import Qt

    long_reply = " ".join(f"word{i}" for i in range(400))
    engine = ReplayEngine([long_reply, "Still here."], delay_s=0.01)
    load(qtbot, host, engine)
    win, events = open_window(qtbot, host)
    win.question.setText("Describe everything.")
    win.question.returnPressed.emit()
    qtbot.waitUntil(lambda: "word3" in win.answer_view.toPlainText(), timeout=10_000)
    assert win.stop_button.isEnabled()
    with qtbot.waitSignal(host.cancelled, timeout=10_000):
        qtbot.mouseClick(win.stop_button, Qt.MouseButton.LeftButton)
    assert win.status.text() == "Stopped."
    assert "word399" not in win.answer_view.toPlainText()
    assert not win.stop_button.isEnabled()
    # The same window answers the next question.
    ask(qtbot, win, "Are you there?")
    qtbot.waitUntil(lambda: "Still here." in win.answer_view.toPlainText())


def test_escape_closes_the_window_and_cancels(qtbot, host):
    from PySide6.QtCore import Qt

    engine = ReplayEngine([" ".join(["slow"] * 500)], delay_s=0.01)
    load(qtbot, host, engine)
    win, events = open_window(qtbot, host)
    win.question.setText("Go on.")
    win.question.returnPressed.emit()
    qtbot.waitUntil(lambda: "slow" in win.answer_view.toPlainText(), timeout=10_000)
    with qtbot.waitSignals([host.cancelled, win.closed], timeout=10_000):
        qtbot.keyClick(win.question, Qt.Key.Key_Escape)
    assert ("ask_window_closed", {}) in events


def test_question_before_the_model_is_ready_says_so(qtbot, host):
    gate = threading.Event()
    engine = ReplayEngine(["Ready now."])

    def slow_factory():
        gate.wait(30)
        return engine

    host.load(slow_factory)
    win, _ = open_window(qtbot, host)
    win.question.setText("Hello?")
    win.question.returnPressed.emit()
    assert "not ready" in win.status.text()
    assert engine.requests == []
    with qtbot.waitSignal(host.ready, timeout=30_000):
        gate.set()
    ask(qtbot, win, "Hello?")
    qtbot.waitUntil(lambda: "Ready now." in win.answer_view.toPlainText())


def test_do_it_and_playwright_buttons_hand_over_the_request(qtbot, host):
    from PySide6.QtCore import Qt

    load(qtbot, host, ReplayEngine(["Click Save."]))
    shot = make_shot()
    win, _ = open_window(qtbot, host, shot, browser_on_screen=True)
    assert not win.do_it_button.isEnabled()  # nothing to do yet
    ask(qtbot, win, "Save the document")
    qtbot.waitUntil(win.do_it_button.isEnabled)
    with qtbot.waitSignal(win.do_it_requested) as blocker:
        qtbot.mouseClick(win.do_it_button, Qt.MouseButton.LeftButton)
    assert blocker.args == ["Save the document", shot]
    win.question.setText("Open the settings page")
    with qtbot.waitSignal(win.playwright_requested) as blocker:
        qtbot.mouseClick(win.playwright_button, Qt.MouseButton.LeftButton)
    assert blocker.args[0] == "Open the settings page"


def test_playwright_button_only_for_a_browser_on_screen(qtbot, host):
    load(qtbot, host, ReplayEngine([]))
    win, _ = open_window(qtbot, host, browser_on_screen=False)
    assert not win.playwright_button.isVisible()


@pytest.mark.slow
def test_streaming_from_the_tiny_local_model_and_a_follow_up_on_the_same_session(qtbot, host, tiny_model_dir):
    from qvl_agent.config import Settings
    from qvl_agent.engine.qwen3vl import Qwen3VLEngine

    settings = Settings(model=str(tiny_model_dir), device="cpu")
    with qtbot.waitSignal(host.ready, timeout=300_000):
        host.load(lambda: Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=settings))
    pieces = []
    host.piece.connect(lambda _req, piece: pieces.append(piece))
    win, events = open_window(qtbot, host, make_shot(256, 192), options=GenerationOptions(max_new_tokens=12))
    ask(qtbot, win, "What is on the screen?", timeout=300_000)
    first = [d for name, d in events if name == "answer_done"][-1]
    assert first["text"] and first["text"] == "".join(pieces)
    assert len(pieces) > 1  # streamed token by token
    assert first["stats"]["vision"] == "miss"
    assert "vision features computed" in win.status.text() and "first token" in win.status.text()

    ask(qtbot, win, "And in the corner?", timeout=300_000)
    second = [d for name, d in events if name == "answer_done"][-1]
    assert second["turn"] == 2
    assert second["stats"]["vision"] != "miss"  # the screenshot was not encoded again
    assert second["stats"]["cached_tokens"] > 0  # the first turn's KV cache was reused
    assert "reused" in win.status.text()
