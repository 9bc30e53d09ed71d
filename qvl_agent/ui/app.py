"""The tray app: icon and menu (or a launcher), hotkeys, the engine in the background, ask windows.

Flow of a hotkey press: pynput's thread → Qt signal → `ask_screen` in the GUI thread, which hides every
window of ours that is showing (ask windows, markers, settings, launcher, waiting a moment for the screen
to repaint without them), grabs the monitor under the pointer, and only then shows the ask window: the
model never sees our own windows. Each screen has one ask window, reused by the next press there. The
engine loads once on its own thread at start; a hotkey pressed while it loads opens the window at once,
and a question asked there is answered as soon as the engine is ready (queued on the engine thread
behind the load). After Settings → Save reloads the engine, the open ask windows are closed, so no
conversation stays tied to the old engine. Every notice is also written to stderr, one line each.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QRect, QTimer, QUrl, Slot
from PySide6.QtGui import QAction, QCursor, QDesktopServices
from PySide6.QtWidgets import QApplication, QInputDialog, QMenu, QSystemTrayIcon, QWidget
from shiboken6 import isValid

from qvl_agent.actions import printable
from qvl_agent.config import Settings, hotkey_label
from qvl_agent.engine import GenerationOptions, open_engine
from qvl_agent.errors import CaptureError
from qvl_agent.grounding import Zoom
from qvl_agent.image import Region, Screenshot
from qvl_agent.ui import hotkeys as hk
from qvl_agent.ui.ask_window import AskWindow
from qvl_agent.ui.automation import Automation
from qvl_agent.ui.banner import banner_text
from qvl_agent.ui.engine_worker import EngineHost
from qvl_agent.ui.instance import SingleInstance
from qvl_agent.ui.launcher import Launcher, make_icon
from qvl_agent.ui.overlay import RegionOverlay
from qvl_agent.ui.screen import browser_on_screen, crop, grab_under_pointer
from qvl_agent.ui.script_flow import ScriptFlow
from qvl_agent.ui.settings_dialog import SettingsDialog

MENU_SETTLE_MS = 150  # a menu or window we just hid must be gone from the screen before the grab


def _transient(widget: QWidget) -> bool:
    """A window of ours that only comes and goes: the tray's notification bubble, a menu, a tooltip."""
    return isinstance(widget, QMenu) or widget.metaObject().className() in ("QBalloonTip", "QTipLabel")


def desktop_place(rect: QRect, ratio: float) -> Region:
    """A rectangle in Qt's pixels as the desktop's pixels, where the person's recorder hears presses."""
    return Region(*(round(v * ratio) for v in (rect.x(), rect.y(), rect.width(), rect.height())))


class TrayApp(QObject):
    """Everything the running tray app holds. Build it after `QApplication`, then `start()`."""

    def __init__(
        self,
        settings: Settings,
        settings_path: Path,
        instance: SingleInstance | None = None,
        notices: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.settings, self.settings_path = settings, settings_path
        self.instance = instance
        self.notices = list(notices)
        self.host = EngineHost(self)
        self.windows: list[AskWindow] = []  # at most one per screen
        self._reused: list[AskWindow] = []  # shown again by the grab that reused them
        self.tray: QSystemTrayIcon | None = None
        self.launcher: Launcher | None = None
        self.listener = hk.HotkeyListener(settings.hotkeys, self)
        self._progress = QTimer(self)
        self._progress.timeout.connect(self._show_progress)
        self._load_started = time.monotonic()
        self.automation = Automation(self.host, lambda: self.settings, self)
        self.automation.started.connect(self._automation_started)
        self.automation.finished.connect(self._automation_finished)
        self.automation.finished.connect(self._report_ready)
        self.scripts = ScriptFlow(self.host, lambda: self.settings, self)
        self.scripts.finished.connect(self._automation_finished)
        self._build_actions()

    # --- setup ----------------------------------------------------------------------------------------

    def _build_actions(self) -> None:
        def action(text: str, slot, tip: str = "") -> QAction:
            a = QAction(text, self)
            a.setToolTip(tip)
            a.triggered.connect(slot)
            return a

        self.ask_action = action("Ask about screen", lambda: self._after_menu(self.ask_screen))
        self.region_action = action("Ask about region", lambda: self._after_menu(self.ask_region))
        self.task_action = action("Run a task…", self.run_task)
        self.takeover_action = action("Take over", self.automation.toggle_takeover, "pause the running task and act")
        self.takeover_action.setEnabled(False)  # while a task runs
        self.report_action = action("Open report", self.open_report, "the last run's report in the web browser")
        self.report_action.setEnabled(False)  # until a run has ended
        self.settings_action = action("Settings", self.open_settings)
        self.quit_action = action("Quit", self.quit)
        self.actions = [
            self.ask_action,
            self.region_action,
            self.task_action,
            self.takeover_action,
            self.report_action,
            self.settings_action,
            self.quit_action,
        ]

    def start(self) -> None:
        self.host.ready.connect(self._engine_ready)
        self.host.failed.connect(self._engine_failed)
        self.host.loading.connect(lambda msg: self._set_status(f"qvl-agent: {msg}"))
        self.listener.ask.connect(self.ask_screen)
        self.listener.region.connect(self.ask_region)
        self.listener.stop.connect(self.stop_everything)
        self.listener.takeover.connect(self.automation.toggle_takeover)
        self.automation.paused.connect(self._paused)
        self.automation.resumed.connect(self._resumed)
        if self.instance is not None:
            self.instance.command.connect(self._command)
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.tray = QSystemTrayIcon(make_icon(), self)
            self.menu = QMenu()
            for a in self.actions:
                self.menu.addAction(a)
            self.tray.setContextMenu(self.menu)
            self.menu.installEventFilter(self)  # where it shows, for a run the person holds
            self.tray.activated.connect(self._tray_activated)
            self.tray.show()
        else:
            self.notices.append(
                "No system tray was found on this desktop: a small launcher window stands in for the tray icon."
            )
            self.launcher = Launcher(self.actions, self.notices[-1])
            self.launcher.show()
        self._set_status("qvl-agent: loading the model…")
        problem = hk.problem() or self.listener.start()
        if problem:
            self.notices.append(problem)
        for notice in self.notices:
            self.notify(notice)
        self.load_engine()

    def load_engine(self) -> None:
        """Load (or reload) the engine in the background; the tooltip counts the seconds meanwhile."""
        settings = self.settings
        self._load_started = time.monotonic()
        self.host.load(lambda: open_engine(settings))
        self._progress.start(1000)

    def _show_progress(self) -> None:
        if self.host.state != "loading":
            self._progress.stop()
            return
        elapsed = time.monotonic() - self._load_started
        what = self.settings.model if self.settings.engine == "local" else self.settings.engine
        self._set_status(f"qvl-agent: loading {what} ({elapsed:.0f} s)…")

    # --- status and notices ---------------------------------------------------------------------------

    def _set_status(self, text: str) -> None:
        if self.tray is not None:
            self.tray.setToolTip(text)
        if self.launcher is not None:
            self.launcher.set_status(text)

    def notify(self, message: str, error: bool = False) -> None:
        """A notification bubble from the tray, or the launcher's status line; also on stderr."""
        print(f"qvl-agent: {message}", file=sys.stderr, flush=True)
        if self.tray is not None:
            icon = QSystemTrayIcon.MessageIcon.Warning if error else QSystemTrayIcon.MessageIcon.Information
            self.tray.showMessage("qvl-agent", message, icon, 6000)
        elif self.launcher is not None:
            self.launcher.set_status(message)

    @Slot(str)
    def _engine_ready(self, message: str) -> None:
        ask, region = hotkey_label(self.settings.hotkeys.ask), hotkey_label(self.settings.hotkeys.region)
        self._set_status(f"qvl-agent: {message}; {ask} asks about the screen")
        self.notify(f"Ready: press {ask} to ask about the screen, {region} for a region.")

    @Slot(str)
    def _engine_failed(self, message: str) -> None:
        self._set_status(f"qvl-agent: {message}")
        self.notify(message, error=True)

    def _not_ready(self) -> bool:
        """Say why the engine cannot take work (its load failed); True when it cannot. While it loads,
        work is queued behind the load on the engine thread, so a loading engine is not refused."""
        if self.host.state != "failed":
            return False
        self.notify(f"The model is not available: {self.host.message}", error=True)
        return True

    # --- asking ---------------------------------------------------------------------------------------

    def _after_menu(self, fn) -> None:
        # Triggered from our own menu or launcher: let it disappear before the screen is grabbed.
        if self.launcher is not None:
            self.launcher.hide()
        QTimer.singleShot(MENU_SETTLE_MS, fn)

    def _restore_launcher(self) -> None:
        if self.launcher is not None:
            self.launcher.show()

    def _own_windows(self) -> list[QWidget]:
        """Our windows that can be on the screen (the tray icon is no window of this kind: it stays)."""
        windows: list[QWidget] = [self.launcher, getattr(self, "_settings_dialog", None)]
        for window in self.windows:
            windows += [window, window.marker]
        windows.append(self.automation.marker)
        return [w for w in windows if w is not None and isValid(w)]

    def _hide_own_windows(self) -> tuple[list[QWidget], bool]:
        """Hide every window of ours that is on screen: (the windows to show again, whether anything was
        hidden). Transient ones (the tray's notification bubble, a menu or tooltip) are hidden for good."""
        shown = [w for w in self._own_windows() if w.isVisible()]
        transient = [w for w in QApplication.topLevelWidgets() if w.isVisible() and _transient(w)]
        for widget in shown + transient:
            widget.hide()
        return shown, bool(shown or transient)

    def _grab_without_us(self, then) -> None:
        """Grab the monitor under the pointer with our windows hidden, then call `then(shot, screen,
        browser)` and show the hidden windows again (the launcher and the other screens' windows)."""
        browser = browser_on_screen()  # before our window takes the focus
        hidden, any_hidden = self._hide_own_windows()

        def grab() -> None:
            try:
                shot, screen = grab_under_pointer()
            except CaptureError as exc:
                self.notify(str(exc), error=True)
                shot = None
            try:
                if shot is not None:
                    then(shot, screen, browser)
            finally:
                for widget in hidden:
                    if isValid(widget) and not widget.isVisible() and widget not in self._reused:
                        widget.show()
                self._reused.clear()
                self._restore_launcher()

        if any_hidden:
            QTimer.singleShot(MENU_SETTLE_MS, grab)  # the windows under ours repaint first
        else:
            grab()

    @Slot()
    def ask_screen(self) -> None:
        """Grab the monitor under the pointer, then open (or reuse) the ask window about it."""
        if self._not_ready():
            return
        if not self.host.is_ready:
            self.notify("Still loading the model: a question asked now is answered as soon as it is ready.")
        self._grab_without_us(lambda shot, _screen, browser: self.open_ask_window(shot, browser))

    @Slot()
    def ask_region(self) -> None:
        """Grab the monitor under the pointer, then let the person drag the region to ask about."""
        if self._not_ready():
            return
        if not self.host.is_ready:
            self.notify("Still loading the model: a question asked now is answered as soon as it is ready.")
        self._grab_without_us(self._choose_region)

    def _choose_region(self, shot: Screenshot, screen, browser: bool) -> None:
        overlay = RegionOverlay(shot, screen)
        overlay.selected.connect(lambda region: self._region_chosen(shot, region, browser))
        overlay.cancelled.connect(self._restore_launcher)
        self._overlay = overlay  # the only reference: without it Python would collect the window
        overlay.open()

    def _region_chosen(self, shot: Screenshot, region, browser: bool) -> None:
        try:
            part = crop(shot, region)
        except CaptureError as exc:
            self.notify(str(exc), error=True)
            return
        self.open_ask_window(part, browser, region=True)
        self._restore_launcher()

    def _window_on(self, screen) -> AskWindow | None:
        for window in self.windows:
            if isValid(window) and QApplication.screenAt(window.frameGeometry().center()) == screen:
                return window
        return None

    def open_ask_window(self, shot: Screenshot, browser: bool = False, region: bool = False) -> AskWindow:
        """The ask window of the screen under the pointer, about `shot`: the one already there starts
        over, else a new one opens in the middle of the screen."""
        screen = QApplication.screenAt(QCursor.pos()) or QApplication.primaryScreen()
        window = self._window_on(screen)
        if window is not None:
            window.options = GenerationOptions(max_new_tokens=self.settings.max_new_tokens)
            window.show_screenshot(shot, browser_on_screen=browser, region=region)
            self._reused.append(window)
        else:
            options = GenerationOptions(max_new_tokens=self.settings.max_new_tokens)
            zoom = Zoom.from_settings(self.settings)
            window = AskWindow(self.host, shot, browser_on_screen=browser, options=options, region=region, zoom=zoom)
            window.do_it_requested.connect(lambda task, s, w=window: self.automation.do_it(task, s, w))
            window.playwright_requested.connect(lambda task, s, w=window: self.scripts.start(task, s, w))
            window.closed.connect(lambda w=window: self.windows.remove(w) if w in self.windows else None)
            self.windows.append(window)
            frame = window.frameGeometry()
            frame.moveCenter(screen.availableGeometry().center())
            window.move(frame.topLeft())
        window.show()
        window.raise_()
        window.activateWindow()
        window.question.setFocus()
        return window

    # --- automation -----------------------------------------------------------------------------------

    @Slot()
    def run_task(self) -> None:
        if self._not_ready():
            return
        if not self.host.is_ready:  # a task that starts clicking whenever loading ends would surprise
            self.notify("Still loading the model; give the task again in a moment.")
            return
        task, ok = QInputDialog.getText(None, "qvl-agent: run a task", "What should the agent do on this screen?")
        if ok and task.strip():
            QTimer.singleShot(MENU_SETTLE_MS, lambda: self.automation.run_task(task.strip()))

    @Slot(str)
    def _automation_started(self, task: str) -> None:
        self.takeover_action.setEnabled(True)
        takeover = hotkey_label(self.settings.hotkeys.takeover)
        self.notify(
            f"Working on “{task}”: press {hotkey_label(self.settings.hotkeys.stop)} to stop, {takeover} to take over."
        )

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        if watched is getattr(self, "menu", None) and event.type() in (QEvent.Type.Show, QEvent.Type.Move):
            # The place it last showed at stays out until hand back: the press that chose Hand back is
            # handled by the recorder after the menu has already closed.
            self.automation.keep_out(desktop_place(self.menu.geometry(), self.menu.devicePixelRatio()), "menu")
        return False

    def _keep_ours_out(self) -> None:
        """The tray's icon (or the launcher) is ours: the person's presses there while they hold the task
        (opening the menu to choose Hand back) are no steps of theirs. The menu says so each time it shows."""
        if self.tray is not None:
            self.automation.keep_out(desktop_place(self.tray.geometry(), self.menu.devicePixelRatio()), "tray")
        if self.launcher is not None:
            where = desktop_place(self.launcher.frameGeometry(), self.launcher.devicePixelRatio())
            self.automation.keep_out(where, "tray")

    @Slot(str)
    def _paused(self, reason: str) -> None:
        self._keep_ours_out()
        self.takeover_action.setText("Hand back")
        keys = hotkey_label(self.settings.hotkeys.takeover)
        said = banner_text(printable(reason))
        self.notify(f"{said}. Press {keys} or choose Hand back in the menu to give the task back.")

    @Slot()
    def _resumed(self) -> None:
        self.takeover_action.setText("Take over")
        self.notify("Handed back: the agent goes on.")

    @Slot(str)
    def _automation_finished(self, message: str) -> None:
        self.takeover_action.setText("Take over")
        self.takeover_action.setEnabled(False)
        self.notify(message)

    @Slot(str)
    def _report_ready(self, message: str) -> None:
        self.report_action.setEnabled(self.automation.last_report is not None)

    @Slot()
    def open_report(self) -> None:
        report = self.automation.last_report
        if report is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(report)))

    @Slot()
    def stop_everything(self, why: str = "The stop hotkey was pressed.") -> None:
        """The stop hotkey (or `tray --send stop`): cancel running answers and halt an automation run."""
        for window in self.windows:
            window.stop()
        self.automation.stop(why)

    # --- settings, commands, quitting -----------------------------------------------------------------

    @Slot()
    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self.settings_path)
        dialog.saved.connect(lambda new: self._settings_saved(new, dialog.outcome))
        dialog.setModal(False)
        dialog.show()
        dialog.raise_()
        dialog.activateWindow()
        self._settings_dialog = dialog  # keep it alive while open

    def _settings_saved(self, new: Settings, outcome: str) -> None:
        old, self.settings = self.settings, new
        if new.hotkeys != old.hotkeys and hk.problem() is None:
            problem = self.listener.restart(new.hotkeys)
            if problem:
                self.notify(problem, error=True)
        reload = dataclasses.replace(old, hotkeys=new.hotkeys, safety_mode=new.safety_mode) != new
        closing = reload and bool(self.windows)
        self.notify(
            outcome
            + (" Reloading the model…" if reload else "")
            + (" The open ask windows were closed (their conversations were with the old model)." if closing else "")
        )
        if reload:
            # Each window's conversation holds a session (and its KV cache) of the old engine: closing
            # them frees those on the engine thread before the load there closes the old engine.
            for window in list(self.windows):
                window.close()
            self.load_engine()

    @Slot(str)
    def _command(self, word: str) -> None:
        {
            "ask": self.ask_screen,
            "region": self.ask_region,
            "task": self.run_task,
            "stop": lambda: self.stop_everything("`qvl-agent tray --send stop` was run."),  # where no hotkeys work
            "takeover": self.automation.toggle_takeover,
            "settings": self.open_settings,
            "quit": self.quit,
        }[word]()

    def _tray_activated(self, reason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:  # a left click opens the menu too
            self.menu.popup(QCursor.pos())

    @Slot()
    def quit(self) -> None:
        self.automation.stop()
        for window in list(self.windows):
            window.close()
        self.listener.stop_listening()
        self.host.close()
        if self.tray is not None:
            self.tray.hide()
        if self.instance is not None:
            self.instance.release()
        QApplication.quit()


def run(settings: Settings, settings_path: Path, notices: tuple[str, ...] = ()) -> int:
    """Run the tray app until Quit. Exit 1 when another instance already runs for this user."""
    app = QApplication.instance() or QApplication(["qvl-agent"])
    app.setApplicationName("qvl-agent")
    app.setQuitOnLastWindowClosed(False)
    instance = SingleInstance(settings_path.parent)
    if not instance.acquire():
        pid = instance.holder_pid()
        print(
            f"qvl-agent: the tray app is already running for this user{f' (process {pid})' if pid else ''}; "
            "use its icon, or `qvl-agent tray --send quit` to stop it.",
            file=sys.stderr,
        )
        return 1
    tray = TrayApp(settings, settings_path, instance, notices)
    tray.start()
    code = app.exec()
    tray.host.close()
    instance.release()
    return code
