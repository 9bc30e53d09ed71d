"""The ask window offscreen (pytest-qt): streaming, Markdown, follow-ups on one session, buttons, cancel,
the status line's figures, and "Where is…?" with its marker."""

from __future__ import annotations

import json
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

    win = AskWindow(host, shot or make_shot(), **kw)
    win.show()
    return win


def ask(qtbot, win, text, timeout=60_000):
    """Ask in the window; the (text, stats) the engine answered with."""
    win.question.setText(text)
    with qtbot.waitSignal(win.host.answered, timeout=timeout) as blocker:
        win.question.returnPressed.emit()
    return blocker.args[1], blocker.args[2]


def test_answer_streams_as_markdown_and_follow_up_reuses_session(qtbot, host):
    engine = ReplayEngine(["The window shows **two buttons**: OK and Cancel.", "The OK button is on the left."])
    load(qtbot, host, engine)
    win = open_window(qtbot, host)
    assert win.windowTitle() == "qvl-agent: ask about the screen"
    assert not win.thumbnail.pixmap().isNull()

    pieces = []
    host.piece.connect(lambda _req, piece: pieces.append(piece))
    first, _ = ask(qtbot, win, "What is on screen?")
    qtbot.waitUntil(lambda: "two buttons" in win.answer_view.toPlainText())
    assert len(pieces) > 3  # arrived piece by piece, not in one block
    # Rendered as Markdown: the bold text is bold, not asterisks.
    assert "**" not in win.answer_view.toPlainText()
    assert "font-weight:700" in win.answer_view.toHtml().replace(" ", "")
    assert "vision features computed" in win.status.text()

    second, _ = ask(qtbot, win, "Which one is on the left?")
    qtbot.waitUntil(lambda: "OK button is on the left" in win.answer_view.toPlainText())
    # Both turns went to one session, and only the first carried the screenshot.
    assert len({r.session_id for r in engine.requests}) == 1
    assert [len(r.image_hashes) for r in engine.requests] == [1, 0]
    assert "reused from the first question" in win.status.text()
    assert [first, second] == engine.replies


def test_copy_button_puts_the_answer_on_the_clipboard(qtbot, host):
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication

    load(qtbot, host, ReplayEngine(["Press `Ctrl+S` to save."]))
    win = open_window(qtbot, host)
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
    win = open_window(qtbot, host)
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
    win = open_window(qtbot, host)
    win.question.setText("Go on.")
    win.question.returnPressed.emit()
    qtbot.waitUntil(lambda: "slow" in win.answer_view.toPlainText(), timeout=10_000)
    with qtbot.waitSignals([host.cancelled, win.closed], timeout=10_000):
        qtbot.keyClick(win.question, Qt.Key.Key_Escape)


def test_a_question_asked_while_the_model_loads_is_answered_once_it_is_ready(qtbot, host):
    gate = threading.Event()
    engine = ReplayEngine(["Ready now."])

    def slow_factory():
        gate.wait(30)
        return engine

    host.load(slow_factory)
    win = open_window(qtbot, host)
    assert "still loading" in win.status.text()
    win.question.setText("Hello?")
    win.question.returnPressed.emit()
    assert "Waiting for the model" in win.status.text()
    assert engine.requests == []
    with qtbot.waitSignal(host.answered, timeout=30_000):
        gate.set()
    qtbot.waitUntil(lambda: "Ready now." in win.answer_view.toPlainText())
    assert [r.text for r in engine.requests] == ["Hello?"]


def test_a_reused_window_starts_over_about_the_new_screenshot(qtbot, host):
    engine = ReplayEngine(["First answer.", "Second answer."])
    load(qtbot, host, engine)
    win = open_window(qtbot, host)
    ask(qtbot, win, "One?")
    qtbot.waitUntil(lambda: "First answer." in win.answer_view.toPlainText())
    first = win.conversation
    other = make_shot(color=(200, 30, 30))
    win.show_screenshot(other, region=True)
    assert win.windowTitle() == "qvl-agent: ask about the region"
    assert win.answer_view.toPlainText() == "" and win.last_answer == ""
    ask(qtbot, win, "Two?")
    qtbot.waitUntil(lambda: "Second answer." in win.answer_view.toPlainText())
    assert win.conversation is not first and first.session is not win.conversation.session
    assert engine.requests[1].image_hashes == [other.content_hash]
    assert "First answer." not in win.answer_view.toPlainText()


def test_do_it_and_playwright_buttons_hand_over_the_request(qtbot, host):
    from PySide6.QtCore import Qt

    load(qtbot, host, ReplayEngine(["Click Save."]))
    shot = make_shot()
    win = open_window(qtbot, host, shot, browser_on_screen=True)
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
    win = open_window(qtbot, host, browser_on_screen=False)
    assert not win.playwright_button.isVisible()
    assert open_window(qtbot, host, browser_on_screen=True).playwright_button.isVisible()


@pytest.mark.slow
def test_streaming_from_the_tiny_local_model_and_a_follow_up_on_the_same_session(qtbot, host, tiny_model_dir):
    from qvl_agent.config import Settings
    from qvl_agent.engine.qwen3vl import Qwen3VLEngine

    settings = Settings(model=str(tiny_model_dir), device="cpu")
    with qtbot.waitSignal(host.ready, timeout=300_000):
        host.load(lambda: Qwen3VLEngine.load(str(tiny_model_dir), device="cpu", settings=settings))
    pieces = []
    host.piece.connect(lambda _req, piece: pieces.append(piece))
    win = open_window(qtbot, host, make_shot(256, 192), options=GenerationOptions(max_new_tokens=12))
    text, stats = ask(qtbot, win, "What is on the screen?", timeout=300_000)
    assert text and text == "".join(pieces)
    assert len(pieces) > 1  # streamed token by token
    assert stats.vision == "miss"
    assert "vision features computed" in win.status.text() and "first token" in win.status.text()

    _, stats = ask(qtbot, win, "And in the corner?", timeout=300_000)
    assert stats.vision != "miss"  # the screenshot was not encoded again
    assert stats.cached_tokens > 0  # the first turn's KV cache was reused
    assert "reused" in win.status.text()


def test_the_status_line_shows_figures_only_when_they_were_measured():
    from qvl_agent.engine.base import TurnStats
    from qvl_agent.ui.ask_window import describe_stats

    # A replayed answer: everything arrived at once, so there is no first-token time or decode rate to show.
    burst = TurnStats(vision="miss", ttft_ms=0.02, decode_tokens=12, decode_tokens_per_s=130_706, total_ms=0.1)
    assert describe_stats(burst, 1) == "vision features computed (not cached)"
    measured = TurnStats(vision="hit", ttft_ms=74.5, decode_tokens=120, decode_tokens_per_s=144.0, total_ms=908)
    assert describe_stats(measured, 1) == "vision features cached · first token 74 ms · 144 tokens/s"
    few = TurnStats(vision="none", ttft_ms=10.4, decode_tokens=3, decode_tokens_per_s=100.0, total_ms=40)
    assert describe_stats(few, 2) == "vision features reused from the first question · first token 10 ms"


def test_a_replayed_answer_shows_no_made_up_figures(qtbot, host):
    load(qtbot, host, ReplayEngine(["A desktop with a tray."]))
    win = open_window(qtbot, host)
    ask(qtbot, win, "What is this?")
    assert win.status.text() == "vision features computed (not cached)"


def test_a_region_is_called_a_region(qtbot, host):
    load(qtbot, host, ReplayEngine([]))
    win = open_window(qtbot, host, region=True)
    assert win.windowTitle() == "qvl-agent: ask about the region"
    assert win.question.placeholderText().startswith("Ask about the region")
    assert "region" in win.status.text() and "screen" not in win.status.text()


def click_call(x, y) -> str:
    call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [x, y]}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def test_where_is_marks_the_point_on_the_screen_and_says_where(qtbot, host):
    from PySide6.QtCore import Qt

    engine = ReplayEngine([click_call(250, 750), "The Save button is blue."])
    load(qtbot, host, engine)
    shot = Screenshot(bytes(4 * 400 * 200), 400, 200, "BGRA", left=100, top=50, source="test")
    win = open_window(qtbot, host, shot)
    win.move(0, 0)  # over the target
    assert win.frameGeometry().contains(200, 200)
    assert not win.locate_button.isEnabled()  # nothing described yet
    win.question.setText("the Save button")
    with qtbot.waitSignal(host.called, timeout=10_000):
        qtbot.mouseClick(win.locate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(win.marker.isVisible)
    # 250/1000 of 400 px from x=100, 750/1000 of 200 px from y=50, on the virtual desktop.
    assert win.marker.target == (200, 200)
    assert win.marker.geometry().center().x() in (199, 200) and win.marker.geometry().center().y() in (199, 200)
    assert "the Save button" in win.status.text() and "(200, 200)" in win.status.text()
    assert not win.frameGeometry().contains(200, 200)  # the window stepped aside from the target
    # The model got the grounding prompt, the screenshot and the description.
    assert engine.requests[0].text == "the Save button" and len(engine.requests[0].image_hashes) == 1
    assert "left_click" in engine.requests[0].system
    # Asking a question next hides the marker; closing the window takes it away for good.
    ask(qtbot, win, "What colour is it?")
    assert not win.marker.isVisible()
    win.close()
    assert not win.marker.isVisible()


def test_where_is_with_an_answer_that_names_no_point_says_so(qtbot, host):
    load(qtbot, host, ReplayEngine(["I cannot see a Save button."]))
    win = open_window(qtbot, host)
    win.question.setText("the Save button")
    with qtbot.waitSignal(host.call_failed, timeout=10_000):
        win.locate()
    assert "names no point" in win.status.text()
    assert not win.marker.isVisible()
    assert win.locate_button.isEnabled()  # the description stays in the box for another try


def test_a_window_that_only_a_running_call_still_holds_is_freed_safely(qtbot, host):
    """A function handed to the engine thread may hold a window; when the GUI lets go of the window first,
    the window must still be freed on the GUI thread (Qt crashes the process freeing a widget elsewhere)."""
    import weakref

    from qvl_agent.ui.ask_window import AskWindow

    load(qtbot, host, ReplayEngine([]))
    gui_let_go = threading.Event()
    freed_on: list[str] = []
    win = AskWindow(host, make_shot())
    win.show()
    win.marker.show_at(10, 10, "a point")
    weakref.finalize(win, lambda: freed_on.append(threading.current_thread().name))

    def reads_the_title(window):
        def fn(_engine):
            gui_let_go.wait(10)
            return window.windowTitle()

        return fn

    with qtbot.waitSignal(host.called, timeout=20_000) as blocker:
        host.call(reads_the_title(win))
        win.hide()
        del win
        gui_let_go.set()
    assert "screen" in blocker.args[1]
    qtbot.waitUntil(lambda: bool(freed_on))
    assert freed_on == [threading.current_thread().name]  # the GUI thread freed it, and the process lives
