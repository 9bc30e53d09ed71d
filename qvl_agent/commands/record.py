"""`qvl-agent record`: the person does a task in a browser window, and it becomes a replayable script.

    qvl-agent record --url URL [--export FILE] [--describe [--model ...] [--engine ...]] [--viewport WxH]
                     [--trace-dir DIR] [--browser PATH] [TASK]

Opens a headed Chromium on URL in a fresh profile and records what the person does there (`act.recorder`)
into a run folder in the same format `browse` writes, each step marked as the person's. The stop hotkey
(`[hotkeys] stop`), closing the window, or Ctrl+C in the terminal ends the recording cleanly: the last
step and the page's end state are read, the trace ends, report.html is written, and with --export FILE
the run is compiled into the same kind of script `browse --export` writes (never over an existing file),
which `qvl-agent replay` runs and `replay --heal` repairs. A password typed into a password field
becomes a declared secret: the trace, the report and the script hold `{{PASSWORD}}`, and the script
reads `$QVL_SECRET_PASSWORD`. A dialog the page opens (alert, confirm, prompt) is the person's to answer in
the window, and the script answers it the same way (a prompt's text is a secret when it asks for one). No
model is needed; with --describe, once the person has stopped, the model says each step's intent in words
from its screenshot (`step_words`), and the script's `# intent:` lines carry them for `replay --heal`. Exit
0 when the recording was written, 1 when the browser failed, 2 on bad usage, 130 after a second Ctrl+C.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from qvl_agent import capture
from qvl_agent.cli import add_engine_args, check_url, end_run_early, print_report
from qvl_agent.config import Settings, hotkey_keys, hotkey_label
from qvl_agent.errors import QvlError, UsageError
from qvl_agent.trace import TraceWriter, default_trace_dir


def register(sub) -> None:
    p = sub.add_parser("record", help="record a task done by hand in a browser", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, metavar="URL", help="the page to start on (http://, https:// or file://)")
    p.add_argument("--export", metavar="FILE", help="write a Playwright script replaying the recording")
    p.add_argument(
        "--describe", action="store_true", help="after the recording, have the model say each step's intent in words"
    )
    add_engine_args(p)
    p.add_argument("--viewport", default="1280x800", metavar="WxH", help="page size in CSS pixels")
    p.add_argument("--trace-dir", metavar="DIR", help="write the recording here (default: a new run folder)")
    p.add_argument("--browser", metavar="FILE", help="Chromium (default: $QVL_BROWSER, or find one)")
    p.add_argument("task", nargs="*", metavar="TASK", help="what the recording does, in words (for the script)")
    p.set_defaults(func=record)


def _check_export(export: Path | None) -> None:
    if export is None:
        return
    if not export.parent.resolve().is_dir():
        raise UsageError(f"Cannot write the script to {export}: the folder {export.parent} does not exist.")
    if export.exists() or export.is_symlink():
        raise UsageError(f"{export} already exists: --export writes a new file (remove it or choose another name).")


def record(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.act.browser import parse_viewport, playwright_key
    from qvl_agent.act.guard import StopSwitch
    from qvl_agent.act.recorder import BrowserRecorder
    from qvl_agent.scripts.export.exporter import write_browser_info

    url = check_url(args.url)
    if capture.display_kind() in ("none", "wayland"):  # the person's window needs an X display
        raise UsageError("record shows a browser window for you to work in, but there is no display here "
                         "(DISPLAY is not set): run it on your desktop.")  # fmt: skip
    viewport = parse_viewport(args.viewport)
    export = Path(args.export) if args.export else None
    _check_export(export)
    task = " ".join(args.task) or f"recorded on {url}"

    trace_dir = Path(args.trace_dir) if args.trace_dir else default_trace_dir()
    trace = TraceWriter(trace_dir)
    recorder = hotkey = None
    switch = StopSwitch()
    stop = {"asked": False}

    def ask_to_stop(_signum, _frame) -> None:
        if stop["asked"]:  # a second Ctrl+C: the person does not want to wait for the end state
            raise KeyboardInterrupt
        stop["asked"] = True  # the loop ends at its next tick, with the browser still open to read from

    previous = signal.signal(signal.SIGINT, ask_to_stop)
    try:
        write_browser_info(trace_dir, url, viewport)
        recorder = BrowserRecorder(url, trace, browser=args.browser, configured_browser=settings.browser,
                                   viewport=viewport)  # fmt: skip
        trace.start(task=task, engine="none (recorded by a person)", executor="browser", mode="record")
        hotkey = _stop_hotkey(settings, switch)
        keys = f"press {hotkey_label(settings.hotkeys.stop)}, " if hotkey else ""
        print(f"qvl-agent: recording in the browser window on {url}; to stop, {keys}close the window or press "
              "Ctrl+C here.", file=sys.stderr, flush=True)  # fmt: skip
        why = recorder.wait(lambda: stop["asked"] or switch.is_set())
        if switch.is_set():
            why = f"the stop hotkey {hotkey_label(settings.hotkeys.stop)} ended it"
            recorder.forget_key(playwright_key(tuple(hotkey_keys(settings.hotkeys.stop))))
        elif why == "stopped":
            why = "Ctrl+C ended it"
        final = recorder.stop()
        write_browser_info(trace_dir, url, viewport, final)
        message = f"Recorded {recorder.steps} step(s) done by the person; {why}."
        trace.end(status="success", answer="", steps=recorder.steps, message=message)
    except (QvlError, KeyboardInterrupt) as exc:
        signal.signal(signal.SIGINT, previous)
        if recorder is not None:
            recorder.close()
        end_run_early(trace, exc, task=task, engine="none", executor="browser", mode="record")
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        if hotkey is not None:
            hotkey.close()
        if recorder is not None:
            recorder.close()
        trace.close()

    print(f"qvl-agent: {message}", file=sys.stderr, flush=True)
    for problem in recorder.problems:
        print(f"qvl-agent: note: {problem}", file=sys.stderr, flush=True)
    for name in recorder.secrets.values:
        print(f"qvl-agent: a password was typed: it is the secret {name}, read from $QVL_SECRET_{name} on replay "
              "(the recording does not hold it).", file=sys.stderr, flush=True)  # fmt: skip
    print(f"qvl-agent: trace: {trace_dir}", file=sys.stderr, flush=True)
    print_report(trace_dir)
    words = _describe(settings, trace_dir, recorder.secrets) if args.describe else {}
    if export is not None:
        compiled = _export(trace_dir, export, recorder.typed, words)
        print(f"qvl-agent: wrote {export}; replay it with: qvl-agent replay {export}", file=sys.stderr, flush=True)
        for note in compiled.unexpressed:
            print(f"qvl-agent: note: {note}", file=sys.stderr, flush=True)
    return 0


def _stop_hotkey(settings: Settings, switch):
    """The stop hotkey (`[hotkeys] stop`, Ctrl+Alt+Esc by default) listening to end the recording, or None
    with a note when global hotkeys cannot work here (the window and Ctrl+C still end it)."""
    from qvl_agent.act.guard import HotkeyListener

    listener = HotkeyListener(settings.hotkeys.stop, switch)
    try:
        listener.start()
    except RuntimeError as exc:
        print(f"qvl-agent: note: the stop hotkey is not available: {exc}.", file=sys.stderr, flush=True)
        return None
    return listener


def _describe(settings: Settings, trace_dir: Path, secrets) -> dict[int, str]:
    """Each step's intent in words (kept beside the trace as intents.json), or {} with a note when the
    model cannot be had: the recording stands without them."""
    import json

    from qvl_agent.engine import open_engine
    from qvl_agent.step_words import describe_steps
    from qvl_agent.trace import read_trace, write_private

    print("qvl-agent: asking the model what each step meant ...", file=sys.stderr, flush=True)
    try:
        with open_engine(settings) as engine:
            words = describe_steps(engine, read_trace(trace_dir), secrets)
    except QvlError as exc:
        print(f"qvl-agent: note: the steps were not described: {exc}", file=sys.stderr, flush=True)
        return {}
    write_private(trace_dir / "intents.json", json.dumps({str(k): v for k, v in words.items()}, indent=1))
    return words


def _export(trace_dir: Path, export: Path, typed: dict, words: dict[int, str]):
    """The recording as a script (never over an existing file), each step's intent carrying its words."""
    import json

    from qvl_agent.scripts.export.exporter import BROWSER_FILE, export_run, steps_from_trace
    from qvl_agent.trace import read_trace

    info = json.loads((trace_dir / BROWSER_FILE).read_text(encoding="utf-8"))
    trace = read_trace(trace_dir)
    steps = steps_from_trace(trace, typed)
    for step in steps:
        step["reason"] = words.get(step["step"], step["reason"])
    viewport = tuple(info.get("viewport") or (1280, 800))
    task = trace.run.get("task", "")
    return export_run(export, info["url"], steps, info.get("final"), task=task, viewport=viewport, replace=False)
