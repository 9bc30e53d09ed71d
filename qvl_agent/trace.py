"""Run traces on disk: a folder per run, written step by step so a crash loses nothing already done.

    DIR/trace.jsonl     one JSON object per line:
                          {"type": "run", "task", "engine", "executor", "mode", "started", ...}   first
                          {"type": "step", "step": N, "screenshot": "step-NNN.png", "screen": {...},
                           "reply", "actions": [...], "results": [...], "error", "timings", "engine",
                           "capture": "reused" when the settled screen was reused, not grabbed again}
                          {"type": "end", "status", "answer", "steps", "message", "finished",
                           "dry_run", "would_do"}                                                 last
                          (status "dry_run": a dry run the model ended as done; nothing was done)
    DIR/step-NNN.png    the screenshot the model looked at in step N
    DIR/trace.zip       a browser run's Playwright trace (`playwright show-trace DIR/trace.zip`), when kept

Runs go to runs/ in the user's data folder unless told otherwise (`--trace-dir`, an MCP replay's heals/
inside its run folder): each of those is remembered, one absolute path a line, in `elsewhere.txt` beside
runs/ when its trace starts, so `trace list` finds every run the person made (`all_runs`); a remembered
folder deleted since is skipped.

A run folder is private: created 0700 (and the folders above it that it creates, such as the runs folder),
its files 0600 whatever the umask (a trace can show what was on the screen).
Each step's PNG is written (to a temporary name, then renamed) before its line, and every line is
flushed and fsync'd, so after a crash every line in trace.jsonl has its PNG. `read_trace` skips a last
line cut off mid-write. Every run ends with an end record, also one that failed to start or was
interrupted (`end_early`), so no folder is listed as unfinished unless its process died. This module knows
nothing about engines or executors.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.errors import InputError
from qvl_agent.image import Screenshot

TRACE_FILE = "trace.jsonl"
PLAYWRIGHT_TRACE = "trace.zip"


def runs_root() -> Path:
    """Where runs go unless told otherwise: runs/ in the user's data folder."""
    import platformdirs

    return Path(platformdirs.user_data_dir("qvl-agent", appauthor=False)) / "runs"


def elsewhere_file() -> Path:
    """The list of run folders made outside `runs_root()`, one absolute path a line."""
    return runs_root().parent / "elsewhere.txt"


def _remember(directory: Path) -> None:
    """Note a run folder outside `runs_root()` in `elsewhere_file()`, so `trace list` finds it. A list that
    cannot be written costs only the listing, never the run."""
    folder = directory.resolve()
    if folder.parent == runs_root().resolve():
        return
    try:
        index = elsewhere_file()
        make_private_dirs(index.parent)
        with open(index, "a", encoding="utf-8", errors="backslashreplace", opener=_private) as fh:
            fh.write(f"{folder}\n")
    except OSError:
        pass


def default_trace_dir(root: Path | None = None) -> Path:
    """A new, unused run folder under `root` (default `runs_root()`): <date>-<time>-<pid>, with -2, -3...
    added when one process starts several runs within a second (the MCP server, the tray)."""
    root = root if root is not None else runs_root()
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in range(1, 10_000):
        candidate = root / (base if n == 1 else f"{base}-{n}")
        if not candidate.exists():
            return candidate
    raise InputError(f"Too many runs in {root} within one second.")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class TraceWriter:
    """Appends a run to `directory` (created if needed)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        try:
            make_private_dirs(self.dir.parent)
            self.dir.mkdir(mode=0o700, exist_ok=True)
            self.dir.chmod(0o700)
            if (self.dir / TRACE_FILE).exists():
                raise InputError(f"{self.dir} already holds a trace; give a new or empty folder.")
            # held open for the whole run
            # A lone surrogate (a remote reply's JSON "\ud800", a task from argv's undecodable bytes) is
            # written as its JSON escape \ud800, so one odd character never ends a run with a traceback.
            self._fh = open(self.dir / TRACE_FILE, "a", encoding="utf-8", errors="backslashreplace", opener=_private)
        except OSError as exc:
            raise InputError(f"Cannot write a trace to {self.dir}: {exc.strerror or exc}.") from None
        _remember(self.dir)
        self.started = False
        self.ended = False

    def _line(self, record: dict) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def start(self, **info) -> None:
        self._line({"type": "run", "started": _now(), **info})
        self.started = True

    def screenshot(self, step: int, shot: Screenshot) -> str:
        """Write step N's screenshot as step-NNN.png; returns its file name."""
        name = f"step-{step:03d}.png"
        tmp = self.dir / f".{name}.tmp"
        with open(tmp, "wb", opener=_private) as fh:
            fh.write(shot.to_png())
        tmp.replace(self.dir / name)
        return name

    def step(self, record: dict) -> None:
        self._line({"type": "step", "time": _now(), **record})

    def end(self, **info) -> None:
        self._line({"type": "end", "finished": _now(), **info})
        self.ended = True

    def end_early(self, status: str, message: str, **run_info) -> None:
        """End a run that stopped outside the step loop (a start page that did not open, Ctrl+C while the
        model loaded): the folder still says what the run was and how it ended. Nothing when it has ended."""
        if self.ended or self._fh.closed:
            return
        if not self.started:
            self.start(**run_info)
        self.end(status=status, answer="", steps=0, message=message)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        for path in self.dir.iterdir():  # files others wrote into the run (browser.json, ...)
            if path.is_file() and not path.is_symlink():
                path.chmod(0o600)


def make_private_dirs(path: Path) -> None:
    """Create `path` and any missing folder above it as 0700, whatever the umask (under umask 0 the runs
    folder would otherwise be world-writable, and anyone could plant or swap a run in it). Folders that
    already exist keep their mode: they are the person's."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        folder.chmod(0o700)


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def write_private(path: str | os.PathLike, text: str) -> None:
    """Write a file of a run atomically, readable by its owner only (runs hold screenshots and typed text)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = _private(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:  # lone surrogates as backslash escapes
        fh.write(text)
    os.chmod(tmp, 0o600)  # an older temporary file keeps its own mode through O_CREAT
    tmp.replace(path)


@dataclass
class Trace:
    dir: Path
    run: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    end: dict | None = None  # None when the run crashed or is still going
    damaged_lines: int = 0


def read_trace(directory: str | os.PathLike) -> Trace:
    """Read a run folder; a line cut off by a crash is counted in `damaged_lines`, not fatal."""
    d = Path(directory)
    path = d / TRACE_FILE
    if not d.is_dir():
        raise InputError(f"There is no trace folder {d}.")
    if not path.is_file():
        raise InputError(f"{d} is not a run trace: it has no {TRACE_FILE}.")
    trace = Trace(d)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                trace.damaged_lines += 1
                continue
            kind = record.get("type") if isinstance(record, dict) else None
            if kind == "run":
                trace.run = _text_fields(record)
            elif kind == "step" and _well_formed_step(record):
                trace.steps.append(record)
            elif kind == "end":
                trace.end = _text_fields(record)
            else:
                trace.damaged_lines += 1
    return trace


# What the records hold, by type: a line of valid JSON in another shape (edited by hand, or written by
# something else) must not trip `trace show`, `trace list` or `trace report`. A step record that does not
# fit is a damaged line; a run or end record keeps only its fields that fit.
_STEP_FIELDS = {
    "step": int, "reply": str, "error": str, "observation": str, "screenshot": str, "screen": dict, "engine": dict,
    "timings": dict, "actions": list, "results": list, "capture": str,
}  # fmt: skip
_RESULT_FIELDS = {"action": str, "ok": bool, "message": str, "guard": str, "pixels": list, "detail": dict}
_ACTION_FIELDS = {"action": str, "pixels": int | float}
_RUN_END_TEXT = ("task", "engine", "executor", "mode", "started", "finished", "status", "answer", "message")


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fits(record: dict, fields: dict) -> bool:
    return all(name not in record or isinstance(record[name], kind) for name, kind in fields.items())


def _well_formed_step(record: dict) -> bool:
    if not isinstance(record.get("step"), int) or not _fits(record, _STEP_FIELDS):
        return False
    if not all(_number(v) for v in (record.get("screen") or {}).values()):
        return False
    if not all(_number(v) for v in (record.get("timings") or {}).values()):
        return False
    if not all(isinstance(a, dict) and _fits(a, _ACTION_FIELDS) for a in record.get("actions") or []):
        return False
    for result in record.get("results") or []:
        if not isinstance(result, dict) or not _fits(result, _RESULT_FIELDS):
            return False
        pixels = result.get("pixels") or []
        if not all(isinstance(p, list) and len(p) == 2 and all(_number(v) for v in p) for p in pixels):
            return False
    return True


def _text_fields(record: dict) -> dict:
    """A run or end record without the fields that should be text and are not."""
    return {k: v for k, v in record.items() if k not in _RUN_END_TEXT or isinstance(v, str)}


@dataclass(frozen=True)
class RunSummary:
    """One line of `trace list`: a run folder with its task, steps and how it ended."""

    dir: Path
    task: str
    started: str
    steps: int
    outcome: str  # the end record's status, or "unfinished" for a crashed or running run
    dry_run: bool = False

    @property
    def outcome_text(self) -> str:
        """The status, marked for a dry run that ended otherwise ("dry_run" says it by itself)."""
        return f"{self.outcome} (dry run)" if self.dry_run and self.outcome != "dry_run" else self.outcome


def _run_key(path: Path) -> tuple:
    # Folder names start with the start time; the -N suffix of a second run in the same second sorts after.
    stem, _, n = path.name.rpartition("-")
    return (stem, int(n)) if n.isdigit() and stem.count("-") >= 2 else (path.name, 0)


def run_dirs(root: Path | None = None) -> list[Path]:
    """Every run folder under `root` (default `runs_root()`), newest first."""
    root = root if root is not None else runs_root()
    try:
        found = [d for d in root.iterdir() if (d / TRACE_FILE).is_file()]
    except OSError:
        return []
    return sorted(found, key=_run_key, reverse=True)


def all_runs() -> list[Path]:
    """Every run the person made, newest first: the folders in `runs_root()` and those remembered in
    `elsewhere_file()` that still hold a trace."""
    found = {d.resolve(): d for d in run_dirs()}
    try:
        listed = elsewhere_file().read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        listed = []
    for line in listed:
        folder = Path(line)
        if folder.is_absolute() and (folder / TRACE_FILE).is_file():
            found.setdefault(folder.resolve(), folder)
    return sorted(found.values(), key=_started_key, reverse=True)


def _started_key(path: Path) -> tuple:
    """When the run started (its first line's "started", to the second), then when its trace was last
    written, then its name."""
    from datetime import datetime

    try:
        written = (path / TRACE_FILE).stat().st_mtime
    except OSError:
        written = 0.0
    try:
        with open(path / TRACE_FILE, encoding="utf-8", errors="replace") as fh:
            started = json.loads(fh.readline()).get("started", "")
        when = int(datetime.strptime(started, "%Y-%m-%dT%H:%M:%S%z").timestamp())
    except (OSError, ValueError, AttributeError, TypeError):
        when = int(written)
    return (when, written, _run_key(path))


def latest_run(root: Path | None = None) -> Path:
    """The newest run folder; InputError when there is none."""
    root = root if root is not None else runs_root()
    dirs = run_dirs(root)
    if not dirs:
        raise InputError(f"There are no runs in {root} yet: start one with qvl-agent run or browse.")
    return dirs[0]


def summarize(directory: str | os.PathLike) -> RunSummary:
    trace = read_trace(directory)
    outcome = trace.end.get("status", "?") if trace.end else "unfinished"
    return RunSummary(
        trace.dir,
        str(trace.run.get("task", "?")),
        str(trace.run.get("started", "")),
        len(trace.steps),
        outcome,
        is_dry_run(trace),
    )


def is_dry_run(trace: Trace) -> bool:
    """Whether the run only showed what it would do (its mode, or its end record, says so)."""
    return trace.run.get("mode") == "dry-run" or (trace.end or {}).get("dry_run") is True


def would_do(trace: Trace) -> list[str]:
    """A dry run's actions that would have run, as its end record lists them (text only)."""
    listed = (trace.end or {}).get("would_do")
    return [str(x) for x in listed if isinstance(x, str)] if isinstance(listed, list) else []
