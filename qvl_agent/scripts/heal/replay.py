"""`replay --heal`: a sandboxed replay whose broken steps the model repairs, and what comes out of it.

`heal_replay(script, ask, ...)` runs the script the way `replay.replay_script` does (the same sandbox,
origins and output folder), with two things more inside: a unix socket to a `service.HealService` and
`hook_in_sandbox.py` run before the script (with `playwright/locate.py` beside it, the same element
resolver the recorder uses). Why inside: the script drives its own Chromium in the sandbox, which
nothing outside can reach; the hook sees the failing call, the live page and the script's own frame, and
only a screenshot, an intent and a point cross the socket.

After the run: the run folder (`trace.jsonl` with one step per heal: its screenshot, the model's point
as a click marker, the failing and the new locator; and its `report.html`), and, when the replay reached
the end with at least one heal, `SCRIPT.healed.py` with the repaired locators (`rewrite`), which
replays without the model (`SCRIPT.healed-2.py` and so on when one is already there: nothing is
overwritten). A replay that stopped on a heal, or failed after one, writes no healed script:
its heals are not known to lead to the recorded end state.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.playwright import locate
from qvl_agent.sandbox.bubblewrap import SCRIPT_INSIDE, Bind
from qvl_agent.scripts.export.steps import python_locator
from qvl_agent.scripts.heal import rewrite
from qvl_agent.scripts.heal.service import Asker, Heal, HealService, model_point
from qvl_agent.scripts.replay import TRACE_FILE, Grant, ReplayResult, replay_script
from qvl_agent.trace import PLAYWRIGHT_TRACE, TraceWriter

HOOK = Path(__file__).with_name("hook_in_sandbox.py")
LOCATE = Path(locate.__file__)  # imports only the standard library: it runs inside too
CONFIG_INSIDE = "/sandbox/heal.json"  # where the hook reads its settings
PROBE_MS = 5000  # a locator that finds nothing for this long (and after the page's network is idle) is broken


@dataclass
class HealResult:
    replay: ReplayResult
    source: str = ""  # the script as it was replayed
    heals: list[Heal] = field(default_factory=list)
    stopped: str = ""  # the sentence a step that could not be healed stopped the replay with
    healed_path: Path | None = None
    diff: str = ""
    not_written: str = ""  # why no healed script was written although steps were healed
    trace_dir: Path | None = None

    @property
    def ok(self) -> bool:
        return self.replay.returncode == 0 and not self.stopped


def healed_name(script: Path) -> Path:
    """SCRIPT.healed.py beside SCRIPT.py."""
    return script.with_name(script.stem + ".healed.py")


def _write_new(script: Path, text: str) -> Path:
    """Write the healed script to the first free of SCRIPT.healed.py, SCRIPT.healed-2.py, ...: never over a
    file already there (an earlier healed script the person may have edited), never through a link."""
    for n in range(1, 1000):
        path = healed_name(script) if n == 1 else script.with_name(f"{script.stem}.healed-{n}.py")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    raise OSError(f"too many healed scripts beside {script.name}")


def heal_replay(
    script: Path,
    ask: Asker,
    *,
    engine_name: str,
    trace_dir: Path,
    browser: str,
    timeout_s: float,
    probe_ms: float = PROBE_MS,
    output: Path | None = None,
    allow: Sequence[str] = (),
    url: str | None = None,
    memory_mb: int | None = None,
    secrets: Mapping[str, str] | None = None,
    allow_files: Sequence[str] = (),
    before_start: Callable[[Grant], None] | None = None,
    step_timeout_s: float | None = None,
) -> HealResult:
    """Replay `script` sandboxed, healing broken steps with the model behind `ask` (`engine_name` goes into
    the report); see the module docstring. A broken step's locator is probed for `probe_ms`, and never
    longer than `step_timeout_s`, the most any step waits.
    Raises what `replay_script` raises, and InputError when `trace_dir` cannot be written."""
    source = script.read_text(encoding="utf-8")
    if step_timeout_s is not None:  # a broken step is given no longer than a step may wait
        probe_ms = min(probe_ms, step_timeout_s * 1000)
    trace = TraceWriter(trace_dir)
    trace.start(task=f"replay --heal {script.name}", engine=engine_name, executor="playwright (sandbox)", mode="heal")
    with tempfile.TemporaryDirectory(prefix="qvl-heal-") as tmp:
        sock = Path(tmp) / "heal.sock"
        config = Path(tmp) / "heal.json"
        config.write_text(
            json.dumps({"socket": "/sandbox/heal.sock", "locate": "/sandbox/qvl_locate.py", "script": SCRIPT_INSIDE,
                        "probe_ms": probe_ms}),
            encoding="utf-8",
        )  # fmt: skip
        service = HealService(ask, sock).start()
        try:
            replayed = replay_script(
                script, browser=browser, timeout_s=timeout_s, output=output, allow=allow, url=url, memory_mb=memory_mb,
                secrets=secrets, binds=[Bind(str(sock), "/sandbox/heal.sock"), Bind(str(config), CONFIG_INSIDE),
                       Bind(str(LOCATE), "/sandbox/qvl_locate.py")],
                init_hooks=[HOOK], allow_files=allow_files, before_start=before_start, step_timeout_s=step_timeout_s,
            )  # fmt: skip
        finally:
            service.stop()
    result = HealResult(replayed, source, service.heals, service.stopped, trace_dir=trace_dir)
    _keep_playwright_trace(replayed, trace_dir)
    _write_trace(trace, source, result)
    if result.ok and any(h.locator for h in result.heals):
        _write_healed(script, source, result)
    elif result.heals and not result.stopped:
        result.not_written = "the replay did not reach the recorded end state after the heals"
    return result


def new_code(heal: Heal) -> str:
    return python_locator(heal.locator) or "" if heal.locator else ""


def failing_code(source: str, heal: Heal) -> str:
    where = heal.where
    if {"end_line", "end_col", "method"} <= where.keys():
        found = rewrite.code_at(source, where["end_line"], where["end_col"], where["method"])
        if found:
            return found
    return heal.failing


def _write_healed(script: Path, source: str, result: HealResult) -> None:
    edits = []
    for heal in result.heals:
        where = heal.where
        if heal.locator and {"end_line", "end_col", "method"} <= where.keys():
            edits.append(rewrite.Edit(where["end_line"], where["end_col"], where["method"], heal.locator,
                                           cover=heal.kind == "cover"))  # fmt: skip
    try:
        healed = rewrite.healed_source(source, edits)
    except rewrite.RewriteError as exc:
        result.not_written = str(exc)
        return
    try:
        path = _write_new(script, healed)
    except OSError as exc:
        result.not_written = f"it could not be saved beside {script.name} ({exc.strerror or exc})"
        return
    result.healed_path = path
    result.diff = rewrite.unified_diff(source, healed, script.name, path.name)


def _keep_playwright_trace(replayed, trace_dir: Path) -> None:
    """A copy of the replay's Playwright trace beside the heal report, which links it."""
    kept = next((p for p in replayed.written if p.parent == replayed.folder and p.name == TRACE_FILE), None)
    if kept is not None:
        try:
            fd = os.open(trace_dir / PLAYWRIGHT_TRACE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(kept.read_bytes())
        except OSError:
            pass  # the report then has no link; the replay's own folder still holds it


def _write_trace(trace: TraceWriter, source: str, result: HealResult) -> None:
    shown = [h for h in result.heals if not h.reused and h.shot is not None]
    for n, heal in enumerate(shown, start=1):
        name = trace.screenshot(n, heal.shot)
        grid = model_point(heal)
        x, y = heal.point or (0, 0)
        old, new = failing_code(source, heal), new_code(heal)
        step_label = f"step {heal.step}" if heal.step is not None else f"line {heal.where.get('line', '?')}"
        message = f"{old} -> {new}" if not heal.problem else f"not healed: {heal.problem}"
        trace.step(
            {
                "step": n,
                "screenshot": name,
                "screen": {"left": 0, "top": 0, "width": heal.shot.width, "height": heal.shot.height},
                "reply": heal.reply,
                "actions": [{"action": "left_click", "coordinate": [round(v, 1) for v in grid]}] if grid else [],
                "results": [{"action": f"heal {step_label}", "ok": not heal.problem, "message": message,
                             "pixels": [[round(x), round(y)]] if heal.point else []}],
                "timings": {"model_ms": round(heal.model_ms, 1), "total_ms": round(heal.total_ms, 1)},
                "heal": {"step": heal.step, "kind": heal.kind, "asked": heal.description, "failing": old,
                         "error": heal.error, "locator": new, "role": heal.role, "problem": heal.problem},
            }
        )  # fmt: skip
    status = "success" if result.ok else "failure"
    message = result.stopped or (
        f"replayed with {len(shown)} healed step(s)" if result.ok else "the script did not reach its end state"
    )
    trace.end(status=status, message=message, steps=len(shown))
    trace.close()
