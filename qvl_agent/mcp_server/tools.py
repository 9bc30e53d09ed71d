"""What the MCP tools do, without MCP: one resident engine shared by screen questions, grounding, desktop
runs and browser runs, one request at a time (the engine serves one thing at a time).

Every method is synchronous, raises `QvlError` for what a caller can get wrong or run into (one sentence
the calling model can act on), and returns plain data. `server.py` wraps them as MCP tools.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from qvl_agent import capture
from qvl_agent.config import Settings
from qvl_agent.engine import STATS_KEYS, Engine, GenerationOptions
from qvl_agent.errors import QvlError, UsageError
from qvl_agent.image import Region, Screenshot
from qvl_agent.trace import TraceWriter, default_trace_dir

MODES = ("dry-run", "auto")
VIEWPORT = (1280, 800)


@dataclass(frozen=True)
class RunOutcome:
    """How a run_task or browse call ended, and where its trace and report are."""

    status: str
    message: str
    answer: str
    steps: int
    trace_dir: str
    report: str

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _text(value: str, what: str, example: str) -> str:
    value = (value or "").strip()
    if not value:
        raise UsageError(f"The {what} is empty: say what you want, e.g. {example}.")
    return value


def _report(trace_dir: Path) -> str:
    from qvl_agent.report import write_report

    try:
        return str(write_report(trace_dir))
    except QvlError:
        return ""  # the run itself is what the caller asked for; the trace is still there


class ScreenTools:
    """The tools' implementations on one engine. `allow_actions` lets run_task move the real pointer."""

    def __init__(self, engine: Engine, settings: Settings, allow_actions: bool = False, browser: str | None = None):
        self.engine = engine
        self.settings = settings
        self.allow_actions = allow_actions
        self.browser = browser
        self._lock = threading.Lock()

    def _options(self) -> GenerationOptions:
        return GenerationOptions(max_new_tokens=self.settings.max_new_tokens)

    def capture(self, monitor: int | None = None, region: Region | None = None) -> Screenshot:
        """Monitor N (1 = first, 0 = the whole desktop) or a region of the desktop, as the model sees it."""
        if monitor is not None and region is not None:
            raise UsageError("Give a monitor or a region, not both.")
        return capture.grab(monitor=monitor, region=region)

    def ask_screen(self, question: str, monitor: int | None = None, region: Region | None = None) -> tuple[str, dict]:
        """(the answer, the turn's stats) for a question about the screen as it is now."""
        question = _text(question, "question", '"Which button saves the file?"')
        shot = self.capture(monitor, region)
        with self._lock:
            session = self.engine.open_session([shot])
            try:
                answer = session.complete(question, options=self._options())
                stats = session.last_stats.as_dict() if session.last_stats else {}
            finally:
                session.close()
        ordered = {k: stats[k] for k in STATS_KEYS if k in stats} | {k: v for k, v in stats.items()}
        return answer.strip(), ordered

    def locate(self, description: str, monitor: int | None = None) -> dict:
        """Where `description` is on the screen: {x, y} in desktop pixels, plus the model's own answer."""
        from qvl_agent.grounding import locate

        description = _text(description, "description", '"the Save button"')
        shot = self.capture(monitor)
        with self._lock:
            point = locate(self.engine, shot, description)
        return {
            "x": point.x,
            "y": point.y,
            "model_x": point.model_x,
            "model_y": point.model_y,
            "ms": round(point.ms, 1),
            "screen": {"left": shot.left, "top": shot.top, "width": shot.width, "height": shot.height},
        }

    def run_task(self, task: str, mode: str = "dry-run", max_steps: int = 30) -> RunOutcome:
        """Carry out `task` on the first monitor: `dry-run` shows what would be done, `auto` does it."""
        from qvl_agent.act.desktop import DesktopExecutor
        from qvl_agent.act.dry_run import DryRunExecutor
        from qvl_agent.act.guard import Guard

        task = _text(task, "task", '"Open the File menu and choose Save"')
        if mode not in MODES:
            raise UsageError(f"mode must be dry-run or auto, not {mode!r}.")
        if mode == "auto" and not self.allow_actions:
            raise UsageError(
                "mode auto is refused: this server was started without --allow-actions, so it may only show "
                "what it would do (mode dry-run). Restart it with qvl-agent mcp --allow-actions to let it act."
            )
        if max_steps < 1:
            raise UsageError(f"max_steps must be at least 1, not {max_steps}.")
        guard = Guard(mode=mode, hotkey=self.settings.hotkeys.stop if mode == "auto" else None)
        desktop = DesktopExecutor(interrupt=guard.switch.check)
        executor = DryRunExecutor(desktop) if mode == "dry-run" else desktop
        with self._lock:
            try:
                guard.confine = executor.observe().region  # the first monitor: nothing outside it is touched
                trace_dir = default_trace_dir()
                result = self._run(task, executor, guard, trace_dir, max_steps, "computer_use", start_guard=True)
            finally:
                guard.close()
                executor.close()
        return RunOutcome(
            result.status, result.message, result.answer, result.steps, str(trace_dir), _report(trace_dir)
        )

    def browse(self, url: str, task: str, max_steps: int = 30) -> tuple[RunOutcome, str]:
        """Carry out `task` on `url` in a fresh headless Chromium; (outcome, the exported Playwright script
        when the run succeeded, else "")."""
        from qvl_agent.act.browser import BrowserExecutor
        from qvl_agent.act.guard import Guard
        from qvl_agent.playwright.export import export_trace, write_browser_info

        url = _text(url, "url", '"https://example.com/"')
        if not url.startswith(("http://", "https://", "file://")):
            raise UsageError(f"url must start with http://, https:// or file://, not {url!r}.")
        task = _text(task, "task", '"Sign in as demo/demo"')
        if max_steps < 1:
            raise UsageError(f"max_steps must be at least 1, not {max_steps}.")
        with self._lock:
            trace_dir = default_trace_dir()
            executor = None
            try:
                write_dir(trace_dir)
                write_browser_info(trace_dir, url, VIEWPORT)
                executor = BrowserExecutor(
                    url, browser=self.browser, configured_browser=self.settings.browser, viewport=VIEWPORT
                )
                result = self._run(task, executor, Guard(mode="auto"), trace_dir, max_steps, "browser")
                final = executor.final_state() if result.ok else None
                write_browser_info(trace_dir, url, VIEWPORT, final)
            finally:
                if executor is not None:
                    executor.close()
        script = ""
        if result.ok:
            script_path = trace_dir / "script.py"
            export_trace(trace_dir, script_path)
            script = script_path.read_text(encoding="utf-8")
        outcome = RunOutcome(
            result.status, result.message, result.answer, result.steps, str(trace_dir), _report(trace_dir)
        )
        return outcome, script

    def _run(self, task, executor, guard, trace_dir: Path, max_steps: int, prompt: str, start_guard: bool = False):
        from qvl_agent.agent import Agent

        trace = TraceWriter(trace_dir)
        try:
            if start_guard:
                guard.start()  # the stop hotkey, when the run may act; a missing one does not stop the run
            agent = Agent(
                self.engine, executor, guard, trace, max_steps=max_steps, prompt_name=prompt, options=self._options()
            )
            return agent.run(task)
        finally:
            trace.close()

    def screenshot(self, monitor: int | None = None) -> tuple[bytes, Screenshot]:
        """The monitor's full-resolution PNG (no engine involved, so no waiting on a run)."""
        shot = self.capture(monitor)
        return shot.to_png(), shot


def write_dir(path: Path) -> None:
    """Create a run folder up front (the browser info is written before the trace's first line)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot create the run folder {path}: {exc.strerror or exc}.") from None
