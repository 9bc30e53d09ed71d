"""`qvl-agent trace show DIR`: print a run's trace, step by step.

Shows the task, and for each step its screenshot file, the model's reply, every action with its pixel
coordinates and result, errors fed back to the model, and timings; then how the run ended (or that it
never ended: a crash leaves every finished step readable).
"""

from __future__ import annotations

import argparse

from qvl_agent.config import Settings
from qvl_agent.trace import read_trace


def register(sub) -> None:
    p = sub.add_parser("trace", help="show a run's trace", description=__doc__.splitlines()[0])
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    show = tsub.add_parser("show", help="print a run folder written by qvl-agent run")
    show.add_argument("dir", metavar="DIR", help="the run's trace folder")
    show.set_defaults(func=run)


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.strip().splitlines()) or prefix


def format_trace(directory) -> str:
    trace = read_trace(directory)
    run = trace.run
    out = [
        f"run      {trace.dir}",
        f"task     {run.get('task', '?')}",
        f"engine   {run.get('engine', '?')}   executor {run.get('executor', '?')}",
        f"mode     {run.get('mode', '?')}",
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
            out.append("  timings: " + ", ".join(f"{k.removesuffix('_ms')} {v:.0f} ms" for k, v in timings.items()))
    if trace.end:
        e = trace.end
        out.append(f"\nend      {e.get('status')} after {e.get('steps')} steps: {e.get('message', '')}")
        if e.get("answer"):
            out.append(f"answer   {e['answer']}")
    else:
        out.append(f"\nend      the run did not finish (crashed or still running); {len(trace.steps)} steps recorded")
    if trace.damaged_lines:
        out.append(f"note     {trace.damaged_lines} damaged line(s) skipped")
    return "\n".join(out)


def run(args: argparse.Namespace, settings: Settings) -> int:
    print(format_trace(args.dir))
    return 0
