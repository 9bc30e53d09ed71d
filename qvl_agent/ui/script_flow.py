"""The ask window's "Playwright script" button: from a browser on screen to a replayable script.

1. The model reads the page's address from the screenshot (prompt `read_url`), on the engine thread.
2. The person confirms or corrects the address (a misread URL must not go unnoticed).
3. The request runs as `qvl-agent browse --export` does: the agent in a fresh headless Chromium with the
   browser prompt, each click resolved to a locator, and the successful run compiled into a standalone
   Playwright script, which is then opened.

Nothing on the desktop is touched: the run happens in its own browser profile. The Playwright sync API
is bound to one thread, so the browser is started, used and closed inside one engine-thread job.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QInputDialog, QLineEdit, QWidget

from qvl_agent import prompts
from qvl_agent.capture import Screenshot
from qvl_agent.config import Settings
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.errors import QvlError
from qvl_agent.ui.engine_worker import EngineHost

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
        emit_event: Callable[..., None],
        parent: QObject | None = None,
        script_dir: Path | None = None,
        trace_root: Path | None = None,
        confirm_url: Callable[[str, QWidget | None], str | None] | None = None,
        open_file: Callable[[Path], None] | None = None,
    ) -> None:
        super().__init__(parent)
        self.host, self.settings, self.emit_event = host, settings, emit_event
        self.script_dir = script_dir
        self.trace_root = trace_root  # None: where `qvl-agent browse` keeps its traces
        self.confirm_url = confirm_url or ask_for_url
        self.open_file = open_file or (lambda path: QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))))
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
            self._end(
                window, f"No Playwright script: {url!r} is not an http://, https:// or file:// address."
            )
            return
        root = self.script_dir or default_script_dir()
        path = root / f"qvl-{time.strftime('%Y%m%d-%H%M%S')}.py"
        settings = self.settings()
        trace_root = self.trace_root
        self._say(window, f"Working in a headless browser on {url}…")
        self.emit_event("playwright_started", url=url, task=task)
        request = self.host.call(
            lambda engine: browse_and_export(engine, settings, url, task, path, trace_root)
        )
        self._pending[request] = ("run", task, window)

    def _got_script(self, value, window: QWidget | None) -> None:
        path, status, message = value
        if path is None:
            self._end(window, f"No Playwright script: the browser run ended with {status}. {message}")
            return
        self.emit_event("playwright_script", path=str(path))
        self.written.emit(str(path))
        self.open_file(Path(path))
        self._end(window, f"Wrote the Playwright script {path}; run it with: python {path}")

    def _say(self, window: QWidget | None, text: str) -> None:
        status = getattr(window, "status", None)
        if status is not None:
            status.setText(text)

    def _end(self, window: QWidget | None, text: str) -> None:
        self._say(window, text)
        self.emit_event("playwright_done", message=text)
        self.finished.emit(text)


def ask_for_url(guess: str, parent: QWidget | None) -> str | None:
    text, ok = QInputDialog.getText(
        parent, "qvl-agent: Playwright script", "The page to start on (check the address the model read):",
        QLineEdit.EchoMode.Normal, guess,
    )  # fmt: skip
    return text.strip() if ok else None


def browse_and_export(
    engine, settings: Settings, url: str, task: str, path: Path, trace_root: Path | None = None
):
    """What `qvl-agent browse --export` does, on the calling (engine) thread.
    Returns (script path or None, run status, message)."""
    from qvl_agent.act.browser import BrowserExecutor
    from qvl_agent.act.guard import Guard
    from qvl_agent.agent import Agent
    from qvl_agent.commands.run import default_trace_dir
    from qvl_agent.export import export_trace, write_browser_info
    from qvl_agent.trace import TraceWriter

    trace_dir = default_trace_dir()
    if trace_root is not None:
        trace_dir = trace_root / trace_dir.name
    trace = TraceWriter(trace_dir)
    executor = None
    try:
        executor = BrowserExecutor(url, configured_browser=settings.browser, headless=True)
        write_browser_info(trace_dir, url, executor.viewport)
        agent = Agent(engine, executor, Guard(mode="auto"), trace, prompt_name="browser",
                      options=GenerationOptions(max_new_tokens=settings.max_new_tokens))  # fmt: skip
        result = agent.run(task)
        final = None
        if result.ok:
            try:
                final = executor.final_state()
            except QvlError:
                final = None
        write_browser_info(trace_dir, url, executor.viewport, final)
    finally:
        if executor is not None:
            executor.close()
        trace.close()
    if not result.ok:
        return None, result.status, result.message
    path.parent.mkdir(parents=True, exist_ok=True)
    export_trace(trace_dir, path)
    return path, result.status, result.message
