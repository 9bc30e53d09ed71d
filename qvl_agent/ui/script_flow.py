"""The ask window's "Playwright script" button: from a browser on screen to a checked, verified script.

1. The model reads the page's address from the screenshot (prompt `read_url`), on the engine thread.
2. The person confirms or corrects the address (a misread URL must not go unnoticed).
3. What `qvl-agent playwright --url URL --verify TASK` does: a headless Chromium looks at the page once
   (screenshot and accessibility snapshot), the model writes a script, the script policy checks it, it runs
   in the sandbox with its own fresh browser, failures go back to the model a few times. The accepted
   script is saved (its first lines say to run it with `qvl-agent replay`, which runs it in the same
   sandbox) and opened in an editor, never run with the person's rights. When no editor opens, the script
   is shown in a window of ours (`script_window`), with Copy and Save as….

Nothing on the desktop is touched. The Playwright sync API is bound to one thread, so the browser is
started, used and closed inside one engine-thread job.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QInputDialog, QLineEdit, QWidget

from qvl_agent import prompts
from qvl_agent.config import Settings
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.image import Screenshot
from qvl_agent.ui.engine_worker import EngineHost
from qvl_agent.ui.script_window import ScriptWindow, open_in_editor

ATTEMPTS = 3  # scripts the model may write before giving up, as `qvl-agent playwright` defaults to
VERIFY_TIMEOUT_S = 60
URL_RE = re.compile(r"(?:https?|file)://[^\s<>\"'`)\]]+")


def url_from_reply(reply: str) -> str:
    """The first URL in the model's reply ("" when it found none)."""
    match = URL_RE.search(reply)
    return match.group(0).rstrip(".,;") if match else ""


def default_script_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("qvl-agent", appauthor=False)) / "scripts"


class ScriptFlow(QObject):
    """Runs the three steps; `finished` carries one sentence, `written` the script's path."""

    finished = Signal(str)
    written = Signal(str)

    def __init__(
        self,
        host: EngineHost,
        settings: Callable[[], Settings],
        parent: QObject | None = None,
        script_dir: Path | None = None,
        confirm_url: Callable[[str, QWidget | None], str | None] | None = None,
        open_file: Callable[[Path], None] | None = None,
    ) -> None:
        super().__init__(parent)
        self.host, self.settings = host, settings
        self.script_dir = script_dir
        self.confirm_url = confirm_url or ask_for_url
        self.open_file = open_file or (lambda path: open_in_editor(path, lambda: self.show_script(path), self))
        self.script_window: ScriptWindow | None = None
        self._pending: dict[int, tuple[str, str, QWidget | None]] = {}  # request -> (stage, task, window)
        host.called.connect(self._called)
        host.call_failed.connect(self._failed)

    def start(self, task: str, shot: Screenshot, window: QWidget | None = None) -> None:
        """Step 1: ask the model for the page's address."""
        prompt = prompts.load("read_url").render()

        def read(engine) -> str:
            session = engine.open_session([shot])
            try:
                return session.complete(prompt, options=GenerationOptions(max_new_tokens=96))
            finally:
                session.close()

        self._say(window, "Reading the page address…")
        self._pending[self.host.call(read)] = ("url", task, window)

    @Slot(int, object)
    def _called(self, request: int, value) -> None:
        if request not in self._pending:
            return
        stage, task, window = self._pending.pop(request)
        if stage == "url":
            self._got_url(task, url_from_reply(str(value)), window)
        else:
            self._got_script(value, window)

    @Slot(int, str)
    def _failed(self, request: int, message: str) -> None:
        if request in self._pending:
            _stage, _task, window = self._pending.pop(request)
            self._end(window, f"No Playwright script: {message}")

    def _got_url(self, task: str, url: str, window: QWidget | None) -> None:
        """Step 2: the person confirms the address; step 3 starts the browser run."""
        url = self.confirm_url(url, window)
        if not url:
            self._end(window, "No Playwright script: no page address was given.")
            return
        if not url.startswith(("http://", "https://", "file://")):
            self._end(window, f"No Playwright script: {url!r} is not an http://, https:// or file:// address.")
            return
        root = self.script_dir or default_script_dir()
        path = root / f"qvl-{time.strftime('%Y%m%d-%H%M%S')}.py"
        settings = self.settings()
        self._say(window, f"Writing and verifying a script for {url}…")
        request = self.host.call(lambda engine: generate_script(engine, settings, url, task, path))
        self._pending[request] = ("run", task, window)

    def _got_script(self, value, window: QWidget | None) -> None:
        path, summary = value
        if path is None:
            self._end(window, f"No Playwright script passed its checks ({summary}).")
            return
        self.written.emit(str(path))
        self.open_file(Path(path))
        self._end(window, f"Wrote the Playwright script {path} ({summary}); run it with: qvl-agent replay {path}")

    def show_script(self, path: Path) -> ScriptWindow:
        """The script in a window of ours, with Copy and Save as… (no editor could be opened)."""
        if self.script_window is not None:
            self.script_window.close()
        window = self.script_window = ScriptWindow(path)
        window.destroyed.connect(lambda *_: self._forget(window))
        window.show()
        window.raise_()
        window.activateWindow()
        return window

    def _forget(self, window: ScriptWindow) -> None:
        if self.script_window is window:
            self.script_window = None

    def _say(self, window: QWidget | None, text: str) -> None:
        status = getattr(window, "status", None)
        if status is not None:
            status.setText(text)

    def _end(self, window: QWidget | None, text: str) -> None:
        self._say(window, text)
        self.finished.emit(text)


def ask_for_url(guess: str, parent: QWidget | None) -> str | None:
    text, ok = QInputDialog.getText(
        parent, "qvl-agent: Playwright script", "The page to start on (check the address the model read):",
        QLineEdit.EchoMode.Normal, guess,
    )  # fmt: skip
    return text.strip() if ok else None


def generate_script(engine, settings: Settings, url: str, task: str, path: Path, attempts: int = ATTEMPTS):
    """`qvl-agent playwright --verify` on the calling (engine) thread: (path or None, one-line summary)."""
    from qvl_agent.act.browser import BrowserExecutor
    from qvl_agent.scripts.write.writer import save_script, write_script

    executor = BrowserExecutor(url, configured_browser=settings.browser, headless=True)
    try:
        shot = executor.observe()
        snapshot = executor.aria_snapshot()
        browser, viewport = executor.executable, executor.viewport
    finally:
        executor.close()
    outcome = write_script(
        engine, shot, url=url, task=task, snapshot=snapshot, viewport=viewport, attempts=attempts,
        verify=True, browser=browser, timeout_s=VERIFY_TIMEOUT_S,
        options=GenerationOptions(max_new_tokens=max(settings.max_new_tokens, 2048)),
        memory_mb=settings.sandbox_memory_mb,
    )  # fmt: skip
    summary = "; ".join(outcome.attempts)
    if not outcome.ok:
        return None, summary
    path.parent.mkdir(parents=True, exist_ok=True)
    save_script(outcome, path, url)
    return path, summary
