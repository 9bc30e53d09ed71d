"""Do it from the ask window (offscreen): the agent runs through the guard in the configured safety mode,
the click marker shows the target before the click, the window hides during the run and comes back.
Also the region overlay and cropping."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QObject

from qvl_agent.config import Settings
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Region, Screenshot


@pytest.fixture(scope="session")
def qapp_args():
    return ["qvl-agent-tests", "-platform", "offscreen"]


def call(action: str, **args) -> str:
    return (
        "<tool_call>" + json.dumps({"name": "computer_use", "arguments": {"action": action, **args}}) + "</tool_call>"
    )


def stripes(width=320, height=200) -> Screenshot:
    """Each column's blue value is its x coordinate (mod 256), so a crop can be checked pixel by pixel."""
    row = b"".join(bytes([x % 256, 0, 0, 0]) for x in range(width))
    return Screenshot(row * height, width, height, "BGRA", source="test")


class ShowWatcher(QObject):
    """Records each time the watched marker window is shown, with the point it marks (a Qt event filter)."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def eventFilter(self, obj, event):  # noqa: N802 (Qt naming)
        if event.type() == QEvent.Type.Show:
            self.log("marker_shown", obj.target)
        return False


@pytest.fixture
def rig(qtbot, tmp_path):
    from shiboken6 import isValid

    from qvl_agent.ui.ask_window import AskWindow
    from qvl_agent.ui.automation import Automation
    from qvl_agent.ui.engine_worker import EngineHost
    from tests.support.recording import RecordingExecutor

    class Rig:
        """The automation with a recording executor; `events` is what happened on screen and at the executor,
        in order: ("marker_shown", (x, y)) when the marker window was shown, ("executed", kind) per action."""

        def __init__(self):
            self.host = EngineHost()
            self.events: list[tuple[str, object]] = []
            self.settings = Settings(safety_mode="auto")
            self.executors: list[RecordingExecutor] = []
            self.automation = Automation(
                self.host, lambda: self.settings, executor_factory=self.make_executor,
                marker_ms=80, trace_root=tmp_path / "runs",
            )  # fmt: skip
            self.started: list[str] = []
            self.automation.started.connect(self.started.append)
            self.watcher = ShowWatcher(self.log)
            self.automation.marker.installEventFilter(self.watcher)

        def log(self, name, data=None):
            self.events.append((name, data))

        def make_executor(self, shot, guard, mode):
            log = self.log

            class Logged(RecordingExecutor):
                def execute(self, action, s):
                    log("executed", action.kind)
                    return super().execute(action, s)

            executor = Logged([shot])
            self.executors.append(executor)
            return executor

        def load(self, replies):
            with qtbot.waitSignal(self.host.ready, timeout=30_000):
                self.host.load(lambda: ReplayEngine(replies))

        def window(self, shot):
            win = AskWindow(self.host, shot)
            win.do_it_requested.connect(lambda task, s: self.automation.do_it(task, s, win))
            win.show()
            self.win = win
            return win

    rig = Rig()
    rig.root = tmp_path / "runs"
    yield rig
    rig.automation.marker.close()
    if hasattr(rig, "win") and isValid(rig.win):
        rig.win.close()
    rig.host.close()


def test_do_it_runs_the_agent_with_a_marker_before_the_click(qtbot, rig):
    from PySide6.QtCore import Qt

    shot = stripes()
    rig.load(
        [
            "Click the OK button.",
            call("left_click", coordinate=[500, 500]),
            call("terminate", status="success"),
        ]
    )
    win = rig.window(shot)
    win.question.setText("Press OK")
    with qtbot.waitSignal(rig.host.answered, timeout=10_000):
        win.question.returnPressed.emit()
    qtbot.waitUntil(win.do_it_button.isEnabled)

    hidden_during_run = []
    with qtbot.waitSignal(rig.automation.finished, timeout=30_000) as done:
        qtbot.mouseClick(win.do_it_button, Qt.MouseButton.LeftButton)
        hidden_during_run.append(win.isVisible())
    assert hidden_during_run == [False]  # the agent must not see or click our window
    assert win.isVisible() and win.status.text() == done.args[0]

    # The person saw the target before the click: the marker window was shown at it, then the click ran.
    assert rig.events == [("marker_shown", (160, 100)), ("executed", "left_click")]  # 500/1000 of 320x200
    assert not rig.automation.marker.isVisible()  # gone before the click, and after the run
    executor = rig.executors[0]
    assert [a.kind for a in executor.actions] == ["left_click"]
    assert executor.recorded[0].pixels == ((160, 100),)
    assert rig.started == ["Press OK"]
    assert done.args[0] == "Task done: The model ended the task: success."
    assert Path(rig.automation.trace_dir, "trace.jsonl").exists()
    assert rig.automation.trace_dir.parent == rig.root
    assert rig.automation.last_report == Path(rig.automation.trace_dir, "report.html")
    assert rig.automation.last_report.exists()


def test_confirm_mode_asks_and_stop_ends_the_run_before_anything_happens(qtbot, rig):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from qvl_agent.ui.confirm_dialog import ConfirmDialog

    rig.settings = dataclasses.replace(rig.settings, safety_mode="confirm")
    rig.load([call("left_click", coordinate=[250, 250]), call("terminate", status="success")])
    asked = []

    def answer_stop():
        box = QApplication.activeModalWidget()
        if isinstance(box, ConfirmDialog):
            asked.append((box.doing.text(), rig.automation.marker.isVisible()))
            box.stop.click()
        else:
            QTimer.singleShot(50, answer_stop)

    QTimer.singleShot(50, answer_stop)
    with qtbot.waitSignal(rig.automation.finished, timeout=30_000) as done:
        rig.automation.do_it("Click the thing", stripes())
    # The action in words, with its pixel; the marker shows the target while the person decides.
    assert asked == [("It will click at pixel (80, 50).", True)]
    # Stop cancels the task, and says so: it is not reported as a failure.
    assert done.args[0] == "Task cancelled: you stopped the run before it would click at pixel (80, 50)."
    assert rig.executors[0].actions == []


def test_a_marker_the_gui_cannot_show_in_time_refuses_the_click(qtbot, rig):
    # The ring stays up longer than the engine thread waits for it: the click must not go ahead unseen.
    rig.automation.marker_ms, rig.automation.marker_timeout_s = 3000, 0.2
    rig.load([call("left_click", coordinate=[500, 500]), call("terminate", status="success")])
    with qtbot.waitSignal(rig.automation.finished, timeout=30_000) as done:
        rig.automation.do_it("Click the middle", stripes())
    assert done.args[0].startswith("Task stopped:") and "marker" in done.args[0]
    assert rig.executors[0].actions == []
    assert "executed" not in [name for name, _ in rig.events]


def test_stop_halts_a_run_and_a_second_do_it_is_refused_while_one_runs(qtbot, rig):
    rig.load([call("wait", time=20), call("terminate", status="success")])
    messages = []
    rig.automation.finished.connect(messages.append)
    assert rig.automation.do_it("Wait a long time", stripes())
    assert not rig.automation.do_it("Something else", stripes())
    assert "already" in messages[-1]
    assert rig.started == ["Wait a long time"]
    with qtbot.waitSignal(rig.automation.finished, timeout=10_000) as done:
        rig.automation.stop()
    assert done.args[0] == "Task stopped: The stop hotkey was pressed."


def test_region_overlay_reports_the_dragged_rectangle_and_crop_keeps_its_pixels(qtbot):
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtGui import QGuiApplication

    from qvl_agent.ui.overlay import RegionOverlay
    from qvl_agent.ui.screen import crop

    screen = QGuiApplication.primaryScreen()
    geo = screen.geometry()
    shot = stripes(geo.width(), geo.height())
    overlay = RegionOverlay(shot, screen)
    qtbot.addWidget(overlay)
    overlay.open()
    with qtbot.waitSignal(overlay.selected) as picked:
        qtbot.mousePress(overlay, Qt.MouseButton.LeftButton, pos=QPoint(300, 40))
        qtbot.mouseMove(overlay, QPoint(200, 100))
        qtbot.mouseRelease(overlay, Qt.MouseButton.LeftButton, pos=QPoint(100, 140))
    region = picked.args[0]
    assert region == Region(geo.x() + 100, geo.y() + 40, 200, 100)
    part = crop(shot, region)
    assert (part.width, part.height, part.left, part.top) == (200, 100, region.left, region.top)
    assert part.data[0] == 100 % 256 and part.data[4 * 199] == 299 % 256


def test_region_overlay_escape_or_a_plain_click_cancels(qtbot):
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtGui import QGuiApplication

    from qvl_agent.ui.overlay import RegionOverlay

    screen = QGuiApplication.primaryScreen()
    shot = stripes(screen.geometry().width(), screen.geometry().height())
    overlay = RegionOverlay(shot, screen)
    overlay.open()
    with qtbot.waitSignal(overlay.cancelled):
        qtbot.mouseClick(overlay, Qt.MouseButton.LeftButton, pos=QPoint(50, 50))
    overlay = RegionOverlay(shot, screen)
    overlay.open()
    with qtbot.waitSignal(overlay.cancelled):
        qtbot.keyClick(overlay, Qt.Key.Key_Escape)
