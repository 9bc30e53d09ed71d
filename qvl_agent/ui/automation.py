"""Hand-offs from the tray app to automation: "Do it", "Run a task…" and "Playwright script".

A run goes through the same `Agent`, `Guard` and desktop executor as `qvl-agent run`, on the engine
thread (the engine serves one thing at a time), in the safety mode from the settings. The GUI stays free:
the agent's callbacks, which run on the engine thread, ask the GUI through signals and wait for the
answer. Before every pointer action a marker ring appears where the click will land; only after it has
been on screen for a moment (and is gone again, so it is not clicked or captured) does the action run.
In confirm mode the marker stays up while the person is asked (`confirm_dialog`: the model's reason and the
action in words, as the terminal asks; Yes, No, which tells the model, or Stop). The stop hotkey halts the
run.

The ask window is hidden during a run, so the agent neither sees it nor clicks it, and comes back with
the result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtWidgets import QWidget

from qvl_agent import actions as A
from qvl_agent.act.describe import confirm_question, declined_message
from qvl_agent.act.guard import Guard, describe_pixels
from qvl_agent.config import Settings
from qvl_agent.errors import ActionError
from qvl_agent.image import Screenshot
from qvl_agent.ui import confirm_dialog
from qvl_agent.ui.engine_worker import EngineHost
from qvl_agent.ui.overlay import ClickMarker

if TYPE_CHECKING:
    from qvl_agent.agent import RunResult

MARKER_MS = 600  # how long the ring shows where the next click lands before the click happens
SHOWN_ACTIONS = 8  # a dry run's actions listed in the window and the notice; the report lists every one
MARKER_TIMEOUT_S = 10.0  # a GUI thread that cannot show the marker by then refuses the action


def default_executor(shot: Screenshot | None, guard: Guard, mode: str):
    """The desktop executor on the monitor (or region) the person was looking at."""
    from qvl_agent.act.desktop import DesktopExecutor
    from qvl_agent.act.dry_run import DryRunExecutor

    region = None if shot is None or shot.monitor is not None else shot.region
    monitor = shot.monitor if shot is not None else None
    desktop = DesktopExecutor(monitor=monitor, region=region, interrupt=guard.switch.check)
    return DryRunExecutor(desktop) if mode == "dry-run" else desktop


def _report(trace_dir) -> Path | None:
    """The run's report.html, written on the engine thread; None when it could not be written."""
    from qvl_agent.errors import QvlError
    from qvl_agent.report import write_report

    try:
        return write_report(trace_dir)
    except QvlError:
        return None


class _Ask(QObject):
    """A question from the engine thread to the GUI thread, answered through a threading.Event."""

    request = Signal(object)

    def __init__(self, handler: Callable[[dict], object], parent: QObject) -> None:
        super().__init__(parent)
        self._handler = handler
        self.request.connect(self._handle)

    def __call__(self, timeout_s: float | None = None, **data) -> object:
        """The handler's result, or None when the GUI did not answer within `timeout_s`."""
        done = threading.Event()
        box = {"data": data, "done": done, "result": None, "expired": False}
        self.request.emit(box)
        # a GUI that is quitting must not leave the engine thread waiting forever
        if not done.wait(timeout_s):
            box["expired"] = True  # a late GUI thread skips it instead of showing a stale marker
            return None
        return box["result"]

    @Slot(object)
    def _handle(self, box: dict) -> None:
        if not box["expired"]:
            self._handler(box)


def describe_outcome(result: RunResult, stopped_at: str = "") -> str:
    """One sentence for the person: how the run ended (Stop in the confirm dialog is a cancel, not a
    failure). A dry run says that nothing was done, then lists the actions it would have run, one a line."""
    if stopped_at:
        return f"Task cancelled: you stopped the run before it would {stopped_at}."
    head = {"success": "Task done", "failure": "Task failed", "stopped": "Task stopped", "limit": "Task not finished"}
    text = f"{head.get(result.status, 'Task ended with an error')}: {result.message}"
    if result.dry_run:  # nothing happened on the screen: the sentence must not read as a done task
        head = {"dry_run": "Dry run finished, nothing was clicked or typed"}
        text = f"{head.get(result.status, 'Dry run ended, nothing was clicked or typed')}: {result.message}"
    text = f"{text} Answer: {result.answer}" if result.answer else text
    if not result.dry_run:
        return text
    lines = result.would_do_text().splitlines()
    if len(lines) > SHOWN_ACTIONS + 1:  # the window and the notice stay on the screen; the report has them all
        more = len(lines) - 1 - SHOWN_ACTIONS
        lines = [*lines[: SHOWN_ACTIONS + 1], f"  … and {more} more (Open report lists them all)."]
    return "\n".join([text, *lines])


class Automation(QObject):
    """Runs the agent for the tray app. `started` carries the task, `finished` one sentence about how the
    run ended; `trace_dir` is the last run's trace folder."""

    started = Signal(str)
    finished = Signal(str)
    paused = Signal(str)  # the person took the run over (the reason, "" for the hotkey or the menu)
    resumed = Signal()

    def __init__(
        self,
        host: EngineHost,
        settings: Callable[[], Settings],
        parent: QObject | None = None,
        executor_factory: Callable = default_executor,
        marker_ms: int = MARKER_MS,
        marker_timeout_s: float = MARKER_TIMEOUT_S,
        trace_root: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.host, self.settings = host, settings
        self.executor_factory = executor_factory
        self.marker_ms = marker_ms
        self.marker_timeout_s = marker_timeout_s
        self.trace_root = trace_root  # None: the same place `qvl-agent run` writes its traces
        self.marker = ClickMarker()
        self.guard: Guard | None = None
        self.takeover = None  # the running task's `takeover.TakeOver`
        self.trace_dir: Path | None = None
        self.running = False
        self.last_report: Path | None = None  # the last run's report.html, for the tray's "Open report"
        self._stopped_at = ""  # the action, in words, at which the person pressed Stop in this run
        self._reply = ""  # the model's last reply, for the confirm dialog (written on the engine thread)
        self._request: int | None = None
        self._window: QWidget | None = None
        self._marker = _Ask(self._show_marker, self)
        self._confirm = _Ask(self._ask_confirm, self)
        host.called.connect(self._done)
        host.call_failed.connect(self._failed)

    # --- starting and stopping ------------------------------------------------------------------------

    def do_it(self, task: str, shot: Screenshot, window: QWidget | None = None) -> bool:
        """Carry out `task` on the screen `shot` came from; the ask window hides during the run."""
        return self._start(task, shot, window)

    def run_task(self, task: str) -> bool:
        from qvl_agent.ui.screen import grab_under_pointer

        shot, _ = grab_under_pointer()  # only to learn which monitor; the agent grabs its own
        return self._start(task, shot, None)

    def _start(self, task: str, shot: Screenshot | None, window: QWidget | None) -> bool:
        if self.running:
            self.finished.emit("An automation run is already going; press the stop hotkey to end it.")
            return False
        settings = self.settings()
        mode = settings.safety_mode
        guard = Guard.for_settings(settings, mode, confine=shot.region if shot is not None else None)
        executor = self.executor_factory(shot, guard, mode)
        from qvl_agent.config import every_hotkey
        from qvl_agent.takeover import TakeOver, desktop_person, masks_what_the_person_typed

        takeover = self.takeover = TakeOver(guard.switch, where="the desktop")
        # From the engine thread: queued to the GUI thread, where the tray's menu and bubble say it.
        takeover.show = lambda state, reason: self.paused.emit(reason) if state == "paused" else self.resumed.emit()
        self.guard, self.running, self._window, self._stopped_at, self._reply = guard, True, window, "", ""
        if window is not None:
            window.hide()
        self.started.emit(task)
        confirm = self._confirm_action

        def on_event(event) -> None:
            self._on_agent_event(event, guard)

        max_new_tokens = settings.max_new_tokens
        trace_root = self.trace_root
        hotkeys = every_hotkey(settings.hotkeys)

        def job(engine):
            from qvl_agent.agent import Agent
            from qvl_agent.engine.base import GenerationOptions
            from qvl_agent.trace import TraceWriter, default_trace_dir

            trace_dir = default_trace_dir()
            if trace_root is not None:
                trace_dir = trace_root / trace_dir.name
            trace = TraceWriter(trace_dir)
            takeover.person = desktop_person(trace, None, hotkeys)
            try:
                agent = Agent(
                    engine, executor, guard, trace, confirm=confirm, on_event=on_event,
                    options=GenerationOptions(max_new_tokens=max_new_tokens), takeover=takeover,
                )  # fmt: skip
                masks_what_the_person_typed(takeover, agent)
                result = agent.run(task)
            finally:
                executor.close()
                trace.close()
            return result, Path(trace_dir), _report(trace_dir)

        self._request = self.host.call(job)
        return True

    @Slot()
    def toggle_takeover(self) -> None:
        """The take-over hotkey or the menu: take the running task over, or hand it back."""
        if self.takeover is not None and self.running:
            self.takeover.toggle()

    def keep_out(self, area, what: str) -> None:
        """A place of the tray's on the desktop (an `image.Region`): while the person holds the running task,
        their presses there (the menu's Hand back) are no steps of theirs."""
        takeover = self.takeover
        if takeover is not None:
            takeover.keep_out(area, what)

    @Slot()
    def stop(self, why: str = "The stop hotkey was pressed.") -> None:
        if self.guard is not None:
            self.guard.stop(why)

    # --- results --------------------------------------------------------------------------------------

    @Slot(int, object)
    def _done(self, request: int, value) -> None:
        if request != self._request:
            return
        result, self.trace_dir, self.last_report = value
        self._end(describe_outcome(result, self._stopped_at))

    @Slot(int, str)
    def _failed(self, request: int, message: str) -> None:
        if request == self._request:
            self._end(f"The task could not run: {message}")

    def _end(self, text: str) -> None:
        self.running, self._request, self.guard, self.takeover = False, None, None, None
        self.marker.hide()
        window, self._window = self._window, None
        if window is not None:
            window.show()
            status = getattr(window, "status", None)
            if status is not None:
                status.setText(text)
        self.finished.emit(text)

    # --- callbacks from the engine thread -------------------------------------------------------------

    def _on_agent_event(self, event, guard: Guard) -> None:
        if event.kind == "reply":
            self._reply = event.message
        if event.kind == "action" and event.pixels and not isinstance(event.action, A.FINAL_ACTIONS):
            x, y = event.pixels[0]
            label = describe_pixels(event.action, list(event.pixels))
            if not self._marker(timeout_s=self.marker_timeout_s, x=x, y=y, label=label):
                # Like a "no": the person never saw where it would land, so the action must not run.
                # The agent checks the stop switch right after this event, before executing.
                guard.stop(f"The click marker could not be shown in time, so this was not done: {label}.")

    def _show_marker(self, box: dict) -> None:
        x, y, label = box["data"]["x"], box["data"]["y"], box["data"]["label"]
        self.marker.show_at(x, y, label)

        def release() -> None:
            self.marker.hide()  # gone before the click, so it is neither clicked nor captured
            box["result"] = True
            box["done"].set()

        QTimer.singleShot(self.marker_ms, release)

    def _confirm_action(self, action, pixels, shot) -> bool:
        """On the engine thread: True for Yes; No raises ActionError, which tells the model; Stop (or a GUI
        that did not answer) ends the run."""
        guard = self.guard
        question = confirm_question(action, pixels, self._reply, guard.stop_chord if guard else frozenset())
        self._reply = ""  # the reason goes with the reply's first action, as on the terminal
        answer = self._confirm(question=question, action=action, pixels=pixels)
        if answer == confirm_dialog.YES:
            return True
        if answer == confirm_dialog.NO:
            raise ActionError(declined_message(action))
        self._stopped_at = question.doing
        if guard is not None:
            guard.stop(f"The person ended the run at: {describe_pixels(action, pixels)}.")
        return False

    def _ask_confirm(self, box: dict) -> None:
        question, action, pixels = box["data"]["question"], box["data"]["action"], box["data"]["pixels"]
        if pixels:
            self.marker.show_at(*pixels[0], A.describe(action))
        box["result"] = confirm_dialog.ask(question, tuple(pixels[0]) if pixels else None)
        self.marker.hide()
        box["done"].set()
