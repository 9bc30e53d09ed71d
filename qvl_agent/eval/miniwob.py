"""MiniWoB++ success rate through the browser loop, on the task pages the PyPI package `miniwob` ships.

The pages are served from the installed package on 127.0.0.1 (no network). Each episode opens a fresh
Chromium on one task page at MiniWoB's own size (160x210 CSS pixels: the query bar and the task area),
seeds the page's random generator (`Math.seedrandom`), lifts the page's 10 s episode timer (a model
step takes longer than a scripted policy's) and starts the episode (`core.startEpisodeReal()`). The
task is the page's utterance (`core.getUtterance()`); the agent (`prompts/browser.txt`, Playwright
actions) works until the page ends the episode (`WOB_DONE_GLOBAL`), the model terminates, or
MAX_STEPS. Success is the page's raw reward (`WOB_RAW_REWARD_GLOBAL`) above 0, as MiniWoB++ counts it.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from qvl_agent.act.guard import Guard
from qvl_agent.agent import Agent
from qvl_agent.engine.base import Engine, GenerationOptions
from qvl_agent.errors import BrowserError, EngineError, UsageError
from qvl_agent.eval.report import ResultsWriter, latency_line, rate, table, write_report

VIEWPORT = (160, 210)
MAX_STEPS = 15
START_TIMEOUT_S = 5.0
_START = """(seed) => {
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = 3600 * 1000;
  core.startEpisodeReal();
}"""
_STATE = "() => ({done: WOB_DONE_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON})"


def task_pages() -> Path:
    """The folder of the installed `miniwob` package's HTML (task pages in miniwob/, shared core/)."""
    spec = importlib.util.find_spec("miniwob")  # finds the package without importing gymnasium & co
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("MiniWoB++ needs its task pages: pip install 'qvl-agent[eval]' (the miniwob package).")
    html = Path(next(iter(spec.submodule_search_locations))) / "html"
    if not (html / "miniwob").is_dir():
        raise UsageError(f"The miniwob package at {html.parent} has no task pages (html/miniwob).")
    return html


def all_tasks(html: Path) -> list[str]:
    return sorted(p.stem for p in (html / "miniwob").glob("*.html"))


def pick_tasks(spec: str | None, html: Path) -> list[str]:
    """The tasks named in `a,b,c` (all of them when None), or UsageError naming an unknown one."""
    known = all_tasks(html)
    if spec is None:
        return known
    # A task named twice runs once: two copies would repeat the same seeds and count the same episodes twice.
    names = list(dict.fromkeys(t.strip().removesuffix(".html") for t in spec.split(",") if t.strip()))
    if not names:
        raise UsageError("--tasks is empty: name MiniWoB++ tasks like click-button,enter-text.")
    for name in names:
        if name not in known:
            near = [k for k in known if name.split("-")[0] in k][:5]
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise UsageError(f"There is no MiniWoB++ task {name!r}{hint}.")
    return names


class PageServer:
    """The task pages on a free port of 127.0.0.1, in a background thread."""

    def __init__(self, root: Path):
        handler = partial(_QuietHandler, directory=str(root))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _EpisodeExecutor:
    """The browser executor, plus: the run stops as soon as the page says the episode is over."""

    def __init__(self, inner, guard: Guard):
        self.inner = inner
        self.guard = guard
        self.name = inner.name

    def observe(self):
        return self.inner.observe()

    def execute(self, action, shot):
        result = self.inner.execute(action, shot)
        self._check_done()
        return result

    def wait_until_settled(self, timeout_s: float) -> None:
        self.inner.wait_until_settled(timeout_s)
        self._check_done()

    def _check_done(self) -> None:
        if self.inner.page.evaluate(_STATE)["done"]:
            self.guard.stop("The episode is over.")

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class Episode:
    task: str
    episode: int
    seed: int
    utterance: str
    success: bool
    reward: float
    steps: int
    ms_per_step: float
    status: str
    reason: str = ""


def run_episode(
    engine: Engine,
    base_url: str,
    task: str,
    episode: int,
    seed: int,
    browser: str | None = None,
    configured_browser: str = "",
    on_start: Callable[[object], None] | None = None,
) -> Episode:
    """One seeded episode of `task`; `on_start(executor)` is called once the task is on the page."""
    from qvl_agent.act.browser import BrowserExecutor

    executor = BrowserExecutor(
        f"{base_url}/miniwob/{task}.html", browser=browser, configured_browser=configured_browser, viewport=VIEWPORT
    )
    try:
        page = executor.page
        page.evaluate(_START, seed)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not page.evaluate("() => WOB_TASK_READY"):
            if time.monotonic() > deadline:
                raise BrowserError(f"The MiniWoB++ task {task} did not get ready within {START_TIMEOUT_S:g} s.")
            page.wait_for_timeout(50)
        utterance = page.evaluate("() => core.getUtterance()")
        if on_start is not None:
            on_start(executor)
        guard = Guard(mode="auto")
        agent = Agent(
            engine,
            _EpisodeExecutor(executor, guard),
            guard,
            max_steps=MAX_STEPS,
            prompt_name="browser",
            settle_timeout_s=1.0,
            options=GenerationOptions(max_new_tokens=256),
        )
        start = time.perf_counter()
        result = agent.run(utterance)
        elapsed_ms = (time.perf_counter() - start) * 1000
        if result.status == "interrupted":  # the agent records Ctrl+C as an outcome; here it ends the eval
            raise KeyboardInterrupt
        if result.status == "error":
            # The engine (or the browser) failed, not the model: counting it as a failed episode would
            # print a success rate that measured nothing.
            raise EngineError(f"MiniWoB++ stopped at {task} episode {episode}: {result.message}")
        state = page.evaluate(_STATE)
    finally:
        executor.close()
    raw = float(state["raw"] or 0.0) if state["done"] else 0.0
    # A run the harness stopped because the page ended the episode is counted at the step it was stopped
    # in, before that step asked the model: the model took one step fewer.
    steps = result.steps - 1 if state["done"] and result.status == "stopped" else result.steps
    return Episode(
        task,
        episode,
        seed,
        utterance,
        raw > 0,
        raw,
        steps,
        elapsed_ms / max(steps, 1),
        result.status,
        str(state.get("reason") or ""),
    )


def evaluate(
    engine: Engine,
    tasks: list[str],
    episodes: int,
    seed: int,
    out: Path,
    browser: str | None = None,
    configured_browser: str = "",
    on_start: Callable[[object], None] | None = None,
    progress=sys.stderr,
) -> list[Episode]:
    """`episodes` seeded episodes of each task (seeds seed, seed+1, ...), each written as it ends."""
    html = task_pages()
    writer = ResultsWriter(out)
    done: list[Episode] = []
    try:
        with PageServer(html) as server:
            for task in tasks:
                for i in range(episodes):
                    try:
                        ep = run_episode(
                            engine, server.url, task, i + 1, seed + i, browser, configured_browser, on_start
                        )
                    except BrowserError as exc:  # one page that breaks does not end a long evaluation
                        ep = Episode(task, i + 1, seed + i, "", False, 0.0, 0, 0.0, "error", str(exc))
                    done.append(ep)
                    writer.write(
                        {
                            "id": f"{task}#{ep.episode}",
                            "task": task,
                            "episode": ep.episode,
                            "seed": ep.seed,
                            "utterance": ep.utterance,
                            "success": ep.success,
                            "reward": ep.reward,
                            "steps": ep.steps,
                            "ms_per_step": round(ep.ms_per_step, 1),
                            "status": ep.status,
                            "reason": ep.reason,
                        }
                    )
                    if progress is not None:
                        mark = "success" if ep.success else "failure"
                        print(f"miniwob: {task} #{ep.episode}: {mark} in {ep.steps} steps", file=progress, flush=True)
    finally:
        writer.close()
    return done


def summarize(episodes: list[Episode]) -> tuple[list[str], list[tuple]]:
    """Printed lines (overall, per task, latency) and the per-task table rows for the report."""
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        by_task[ep.task].append(ep)
    wins = sum(ep.success for ep in episodes)
    lines = [f"MiniWoB++: success {rate(wins, len(episodes))} over {len(by_task)} tasks"]
    rows = []
    for task, eps in by_task.items():
        ok = sum(ep.success for ep in eps)
        steps = statistics.mean(ep.steps for ep in eps)
        ms = statistics.mean(ep.ms_per_step for ep in eps)
        # The report's row holds the very figures of the printed line, so the two never disagree.
        row = (task, len(eps), rate(ok, len(eps)), f"{steps:.1f}", f"{ms:.0f}")
        lines.append(f"  {task}: {row[2]}, {row[3]} steps, {row[4]} ms per step")
        rows.append(row)
    lines.append(latency_line([ep.ms_per_step for ep in episodes], "per step"))
    return lines, rows


def write_miniwob_report(
    out: Path, episodes: list[Episode], lines: list[str], rows: list[tuple], facts: list[tuple[str, str]] = ()
) -> Path:
    per_episode = [
        (ep.task, ep.episode, ep.seed, ep.utterance, "yes" if ep.success else "no", ep.reward, ep.steps, ep.status)
        for ep in sorted(episodes, key=lambda ep: ep.success)  # failures first: what a person looks for
    ]
    sections = [
        ("Tasks", table(("task", "episodes", "success", "steps (mean)", "ms per step (mean)"), rows)),
        ("Episodes", table(("task", "episode", "seed", "utterance", "success", "reward", "steps", "run"), per_episode)),
    ]
    return write_report(out, "qvl-agent eval miniwob", lines, sections, facts)
