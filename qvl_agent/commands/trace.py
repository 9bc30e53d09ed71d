"""`qvl-agent trace list|show|report`: the runs on disk, one run's trace as text, or its visual report.

    qvl-agent trace list [-n N]              recent runs, newest first: folder, start, steps, outcome, task
                                             (runs made elsewhere, with --trace-dir, by their whole path)
    qvl-agent trace show [DIR]               one run as text (default: the latest run)
    qvl-agent trace report [DIR] [--open]    write DIR/report.html and print its path (default: the latest run)

`show` prints the task, and for each step its screenshot file, the model's reply, every action with its pixel
coordinates and result, errors fed back to the model, and timings; then how the run ended (or that it
never ended: a crash leaves every finished step readable).
"""

from __future__ import annotations

import argparse
import sys
import webbrowser

from qvl_agent.actions import printable
from qvl_agent.config import Settings
from qvl_agent.errors import UsageError
from qvl_agent.report import write_report
from qvl_agent.trace import all_runs, is_dry_run, latest_run, read_trace, runs_root, summarize, would_do


def register(sub) -> None:
    p = sub.add_parser("trace", help="list runs, show a run, write its report", description=__doc__.splitlines()[0])
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    ls = tsub.add_parser(
        "list",
        help="recent runs, newest first",
        description="List recent runs, newest first: folder, start, steps, outcome and task.",
    )
    ls.add_argument("-n", "--limit", type=int, default=20, metavar="N", help="show at most N runs")
    ls.set_defaults(func=list_runs)
    show = tsub.add_parser(
        "show",
        help="print a run's trace as text",
        description="Print one run as text: the task, each step's reply, actions and results, and how it ended.",
    )
    show.add_argument("dir", nargs="?", metavar="DIR", help="the run's trace folder (default: the latest run)")
    show.set_defaults(func=run)
    report = tsub.add_parser(
        "report",
        help="write the run's report.html and print its path",
        description="Write the run's visual report (DIR/report.html) and print its path.",
    )
    report.add_argument("dir", nargs="?", metavar="DIR", help="the run's trace folder (default: the latest run)")
    report.add_argument("--open", action="store_true", help="open the report in the web browser")
    report.set_defaults(func=make_report)


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.strip().splitlines()) or prefix


def format_trace(directory) -> str:
    trace = read_trace(directory)
    run = trace.run
    out = [
        f"run      {trace.dir}",
        f"task     {run.get('task', '?')}",
        f"engine   {run.get('engine', '?')}   executor {run.get('executor', '?')}",
        f"mode     {run.get('mode', '?')}"
        + ("   (dry run: nothing was clicked or typed)" if is_dry_run(trace) else ""),
        f"started  {run.get('started', '?')}",
    ]
    for s in trace.steps:
        png = s.get("screenshot")
        screen = s.get("screen") or {}
        where = f"{screen.get('width')}x{screen.get('height')} at ({screen.get('left')}, {screen.get('top')})"
        exists = "" if not png or (trace.dir / png).exists() else " (missing)"
        out.append(f"\nstep {s.get('step')}   {png or 'no screenshot'}{exists}   screen {where}")
        if "reply" in s:
            out.append("  reply:")
            out.append(_indent(s["reply"]))
        for r in s.get("results", []):
            pixels = " ".join(f"({x}, {y})" for x, y in r.get("pixels", []))
            mark = "ok " if r.get("ok") else "ERR"
            out.append(f"  {mark} {r.get('action')}{'  px ' + pixels if pixels else ''}  {r.get('message', '')}")
        if s.get("error"):
            out.append(f"  error: {s['error']}")
        timings = s.get("timings") or {}
        if timings:
            reused = s.get("capture") == "reused"
            shown = [
                "capture reused" if reused and k == "capture_ms" else f"{k.removesuffix('_ms')} {v:.0f} ms"
                for k, v in timings.items()
            ]
            out.append("  timings: " + ", ".join(shown))
    if trace.end:
        e = trace.end
        dry = " (dry run)" if is_dry_run(trace) and e.get("status") != "dry_run" else ""
        out.append(f"\nend      {e.get('status')}{dry} after {e.get('steps')} steps: {e.get('message', '')}")
        if e.get("answer"):
            out.append(f"answer   {e['answer']}")
        for i, what in enumerate(would_do(trace), start=1):
            out.append(f"{'would do' if i == 1 else '':8} {i}. {what}")
    else:
        out.append(f"\nend      the run did not finish (crashed or still running); {len(trace.steps)} steps recorded")
    if trace.damaged_lines:
        out.append(f"note     {trace.damaged_lines} damaged line(s) skipped")
    return "\n".join(out)


def run(args: argparse.Namespace, settings: Settings) -> int:
    # The trace holds the model's words: escape sequences in them must not drive the person's terminal.
    print(printable(format_trace(args.dir or latest_run()), keep="\n"))
    return 0


def list_runs(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}.")
    dirs = all_runs()
    if not dirs:
        print(f"No runs in {runs_root()} yet.")
        return 0
    home = runs_root().resolve()
    for d in dirs[: args.limit]:
        s = summarize(d)
        where = d.name if d.resolve().parent == home else str(d.resolve())  # elsewhere: the whole path
        line = f"{where:26} {s.started[:19]:19}  {s.steps:3} steps  {s.outcome_text:15}  {' '.join(s.task.split())}"
        print(printable(line))
    return 0


def make_report(args: argparse.Namespace, settings: Settings) -> int:
    path = write_report(args.dir or latest_run())
    print(path)
    # webbrowser says False when it found nothing to open with (no display and no text browser, say).
    if args.open and not webbrowser.open(path.resolve().as_uri()):
        print(f"qvl-agent: no web browser could be started here; open {path} in one yourself.", file=sys.stderr)
    return 0
