"""What the MCP tools do, without MCP: one resident engine shared by screen questions, grounding, desktop
runs and browser runs, one request at a time (the engine serves one thing at a time).

Every method is synchronous, raises `QvlError` for what a caller can get wrong or run into (one sentence
the calling model can act on), and returns plain data. `server.py` wraps them as MCP tools.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from qvl_agent import capture
from qvl_agent.config import Settings
from qvl_agent.engine import STATS_KEYS, Engine, GenerationOptions
from qvl_agent.errors import QvlError, UsageError
from qvl_agent.image import Region, Screenshot
from qvl_agent.trace import PLAYWRIGHT_TRACE, TraceWriter, default_trace_dir

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
    dry_run: bool = False
    would_have_run: tuple[str, ...] = ()  # a dry run's actions, with the pixels they would have hit

    @classmethod
    def of(cls, result, trace_dir: Path) -> RunOutcome:
        """From the agent's RunResult; writes the run's report."""
        return cls(
            result.status,
            result.message,
            result.answer,
            result.steps,
            str(trace_dir),
            _report(trace_dir),
            result.dry_run,
            result.would_do,
        )

    def as_dict(self) -> dict:
        data = asdict(self)
        data["would_have_run"] = list(self.would_have_run)
        return data

    def text(self) -> str:
        """The reply a calling model reads first: a dry run says so before anything else, and lists the
        actions it only showed, so it cannot be taken for a task that was done."""
        lines = []
        if self.dry_run:
            lines.append("DRY RUN: nothing was clicked or typed on the screen; the task was NOT carried out.")
        status = f"{self.status} (dry run)" if self.dry_run and self.status != "dry_run" else self.status
        lines.append(f"{status}: {self.message}")
        if self.answer:
            lines.append(f"Answer: {self.answer}")
        if self.dry_run:
            listed = [f"  {i}. {what}" for i, what in enumerate(self.would_have_run, start=1)]
            lines += [f"Would have run ({len(listed)} action{'s' * (len(listed) != 1)}):", *listed]
        lines.append(f"Trace: {self.trace_dir}")
        return "\n".join(lines)


MAX_TEXT_CHARS = 20_000  # a question, task or description; a longer one would hold the engine for minutes
MAX_SCRIPT_CHARS = 1_000_000  # a saved script to replay


def _text(value: str, what: str, example: str) -> str:
    value = (value or "").strip()
    if not value:
        raise UsageError(f"The {what} is empty: say what you want, e.g. {example}.")
    if len(value) > MAX_TEXT_CHARS:
        raise UsageError(f"The {what} is {len(value):,} characters long; keep it under {MAX_TEXT_CHARS:,}.")
    return value


def _check_steps(max_steps: int) -> None:
    if max_steps < 1:
        raise UsageError(f"max_steps must be at least 1, not {max_steps}.")


def _report(trace_dir: Path) -> str:
    from qvl_agent.report import write_report

    try:
        return str(write_report(trace_dir))
    except QvlError:
        return ""  # the run itself is what the caller asked for; the trace is still there


class ScreenTools:
    """The tools' implementations on one engine. `allow_actions` lets run_task move the real pointer."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        allow_actions: bool = False,
        browser: str | None = None,
        allow_local_urls: bool = False,
    ):
        self.engine = engine
        self.settings = settings
        self.allow_actions = allow_actions
        # browse opens no file:// URL and reaches no local address unless the person started the server
        # with --allow-local-urls: the caller is a model, and a page or a document may have steered it.
        self.allow_local_urls = allow_local_urls
        self.browser = browser
        self._runs = threading.Lock()  # one agent run or script replay at a time
        # A batching local engine takes overlapping turns itself (they decode in one step): questions
        # about the screen then go on beside a run. Other engines answer one caller at a time.
        batching = getattr(engine, "batcher", None) is not None
        self._questions = contextlib.nullcontext() if batching else self._runs

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
        with self._questions:
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
        from qvl_agent.grounding import Zoom, locate

        description = _text(description, "description", '"the Save button"')
        shot = self.capture(monitor)
        with self._questions:
            point = locate(self.engine, shot, description, zoom=Zoom.from_settings(self.settings))
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
        _check_steps(max_steps)
        # In auto mode the stop hotkey halts the run; a hotkey that cannot be hooked does not stop it.
        guard = Guard.for_settings(self.settings, mode, hotkey=self.settings.hotkeys.stop if mode == "auto" else None)
        desktop = DesktopExecutor(interrupt=guard.switch.check)
        executor = DryRunExecutor(desktop) if mode == "dry-run" else desktop
        with self._runs:
            trace = None
            try:
                guard.confine = executor.observe().region  # the first monitor: nothing outside it is touched
                trace = TraceWriter(default_trace_dir())
                guard.start()
                result = self._agent(executor, guard, trace, max_steps, "computer_use").run(task)
            finally:
                guard.close()
                executor.close()
                if trace is not None:
                    trace.close()
        return RunOutcome.of(result, trace.dir)

    def browse(self, url: str, task: str, max_steps: int = 30) -> tuple[RunOutcome, str]:
        """Carry out `task` on `url` in a fresh headless Chromium; (outcome, the exported Playwright script
        when the run succeeded, else "")."""
        from qvl_agent.act.browser import BrowserExecutor
        from qvl_agent.act.guard import Guard
        from qvl_agent.act.netguard import local_target
        from qvl_agent.scripts.export.exporter import export_trace, write_browser_info

        url = _text(url, "url", '"https://example.com/"')
        if not url.startswith(("http://", "https://", "file://")):
            raise UsageError(f"url must start with http://, https:// or file://, not {url!r}.")
        if not self.allow_local_urls and (local := local_target(url)):
            raise UsageError(
                f"browse does not open {local} on this server: it only visits public web sites unless the "
                "server was started with --allow-local-urls."
            )
        task = _text(task, "task", '"Sign in as demo/demo"')
        _check_steps(max_steps)
        with self._runs:
            # The browser first: no Chromium or a dead URL leaves no empty run folder behind.
            executor = BrowserExecutor(
                url,
                browser=self.browser,
                configured_browser=self.settings.browser,
                viewport=VIEWPORT,
                block_local=not self.allow_local_urls,
            )
            try:
                trace = TraceWriter(default_trace_dir())
                try:
                    write_browser_info(trace.dir, url, VIEWPORT)
                    executor.keep_playwright_trace(trace.dir / PLAYWRIGHT_TRACE)  # saved when it closes
                    # The run acts only inside its own fresh browser profile: the guard does not ask, and
                    # keys reach the page, never the system.
                    guard = Guard.for_settings(self.settings, "auto", allow_keys=True)
                    result = self._agent(executor, guard, trace, max_steps, "browser").run(task)
                    write_browser_info(trace.dir, url, VIEWPORT, executor.final_state() if result.ok else None)
                finally:
                    trace.close()
            finally:
                executor.close()
        script = ""
        if result.ok:
            export_trace(trace.dir, trace.dir / "script.py")
            script = (trace.dir / "script.py").read_text(encoding="utf-8")
        return RunOutcome.of(result, trace.dir), script

    def replay(self, script: str, heal: bool = False, timeout_s: float = 300) -> dict:
        """Run a saved Playwright script (its text) in the sandbox, as `qvl-agent replay` does: network only
        to the origins its header names, its files into a new folder of its own. With `heal`, a step whose
        locator broke is repaired by the model from a screenshot and the step's intent, and the healed
        script's text comes back. Returns {"exit_status", "output", "heals", "stopped", "healed_script",
        "diff", "report", "folder", "given"} ("given": what the script was given, network, host files and
        secret variables, one line each; a local page its header names is never given here)."""
        from qvl_agent.act.netguard import local_target
        from qvl_agent.grounding import Zoom, point_or_click
        from qvl_agent.playwright.chromium import find_browser
        from qvl_agent.scripts.header import read_origins
        from qvl_agent.scripts.heal.replay import failing_code, heal_replay, new_code
        from qvl_agent.scripts.replay import replay_script

        if not (script or "").strip():
            raise UsageError("The script is empty: pass the text of a saved Playwright script.")
        if len(script) > MAX_SCRIPT_CHARS:
            raise UsageError(f"The script is {len(script):,} characters long; keep it under {MAX_SCRIPT_CHARS:,}.")
        if not 0 < timeout_s <= 3600:
            raise UsageError(f"timeout must be from 0 to 3600 seconds, not {timeout_s:g}.")
        if not self.allow_local_urls:  # as browse: a script's header must not turn the server on its own machine
            for origin in read_origins(script) or []:
                if local := local_target(origin):
                    raise UsageError(
                        f"replay does not reach {local} on this server: it only runs scripts for public web sites "
                        "unless the server was started with --allow-local-urls."
                    )
        browser = find_browser(self.browser, self.settings.browser, headless=True)
        run_dir = default_trace_dir()
        run_dir.mkdir(mode=0o700, parents=True)
        path = run_dir / "script.py"
        path.write_text(script, encoding="utf-8")
        path.chmod(0o600)
        output = run_dir / "files"
        out: dict = {"heals": [], "stopped": "", "healed_script": "", "diff": "", "report": ""}
        with self._runs:
            if heal:
                ground = functools.partial(point_or_click, self.engine, zoom=Zoom.from_settings(self.settings))
                healing = heal_replay(
                    path, ground, engine_name=self.engine.name,
                    trace_dir=run_dir / "heals", browser=browser, timeout_s=timeout_s,
                    output=output, memory_mb=self.settings.sandbox_memory_mb,
                )  # fmt: skip
                result = healing.replay
                out["heals"] = [
                    {"step": h.step, "line": h.where.get("line"), "failing": failing_code(healing.source, h),
                     "locator": new_code(h), "reused": h.reused, "covering": h.kind == "cover",
                     "seconds": round(h.total_ms / 1000, 3), "not_healed": h.problem}
                    for h in healing.heals
                ]  # fmt: skip
                out["stopped"] = healing.stopped
                if healing.healed_path is not None:
                    out["healed_script"] = healing.healed_path.read_text(encoding="utf-8")
                    out["diff"] = healing.diff
                out["report"] = _report(run_dir / "heals")
            else:
                result = replay_script(
                    path, browser=browser, timeout_s=timeout_s, output=output, memory_mb=self.settings.sandbox_memory_mb
                )
        out["exit_status"] = result.returncode
        out["output"] = result.output
        out["folder"] = str(result.folder) if result.folder else ""
        out["given"] = result.grant.lines() if result.grant else []  # network, host files, secret variables
        return out

    def _agent(self, executor, guard, trace: TraceWriter, max_steps: int, prompt: str):
        from qvl_agent.agent import Agent

        return Agent(
            self.engine, executor, guard, trace, max_steps=max_steps, prompt_name=prompt, options=self._options()
        )

    def screenshot(self, monitor: int | None = None) -> tuple[bytes, Screenshot]:
        """The monitor's full-resolution PNG (no engine involved, so no waiting on a run)."""
        shot = self.capture(monitor)
        return shot.to_png(), shot
