"""`qvl-agent run`: carry out a task on the desktop, step by step, with the person in control.

    qvl-agent run [--model ...] [--engine ...] [--yes | --dry-run] [--allow-keys] [--max-steps N]
                  [--monitor N | --region X,Y,W,H] [--trace-dir DIR] [--secret NAME ...] TASK

By default every action is shown with its pixel coordinates, the model's words for the reply and a
marker ring on the screen, and waits on the terminal: y does it, n refuses it and tells the model (which
then tries something else), q (or anything else, or the end of input) ends the run. What could not be
done anyway (a point outside the screen, a key this keyboard lacks, a limit) is refused before asking.
`--yes` runs without asking, `--dry-run` touches nothing. System key combinations (log out, lock, console
switch) are asked about even with `--yes` unless `--allow-keys`. The emergency stop hotkey (default
ctrl+alt+Escape) halts the run at once; `--yes` refuses to start without it. Exit 0 when the model
ends with success, 1 on failure, stop or a limit, 2 on bad usage or input, 3 when a dry run finished
(status dry_run: nothing was done), 130 on Ctrl+C. Every run
writes a trace folder with its outcome and report.html (`qvl-agent trace show DIR` prints it), also a run
that Ctrl+C interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qvl_agent import actions as A
from qvl_agent.act.describe import confirm_question, declined_message
from qvl_agent.act.desktop import DesktopExecutor
from qvl_agent.act.dry_run import DryRunExecutor
from qvl_agent.act.guard import Guard, Pixels, describe_pixels, read_line
from qvl_agent.act.keys import system_chord
from qvl_agent.actions import printable
from qvl_agent.agent import Agent
from qvl_agent.capture import list_monitors, monitor_choices
from qvl_agent.cli import (
    add_engine_args,
    add_secret_args,
    end_run_early,
    notify,
    print_event,
    print_report,
    print_result,
    run_exit_code,
    secrets_from_args,
    start_takeover,
    task_and_steps,
)
from qvl_agent.config import Settings, every_hotkey, hotkey_label
from qvl_agent.engine import GenerationOptions, check_engine
from qvl_agent.errors import ActionError, QvlError, UsageError
from qvl_agent.image import Region, Screenshot
from qvl_agent.planner import check_agent_model, open_agent_engine
from qvl_agent.takeover import desktop_person, masks_what_the_person_typed
from qvl_agent.trace import TraceWriter, default_trace_dir
from qvl_agent.ui.terminal_marker import TerminalMarker

# The capital letter is what Enter (or the end of input) answers: in confirm mode the run ends, as before;
# under --yes, which asks only about system key combinations, the chord is refused and the model told.
PROMPTS = {"auto": "Do it? [y/N/q] ", "confirm": "Do it? [y/n/Q] "}
HELP = "(y: do it, n: refuse and tell the model, q: end the run)"


class TerminalConfirm:
    """Confirm mode on the terminal. Called by the guard for each action after its own checks (screen,
    confinement, limits); refuses what the keyboard cannot do before asking; shows the reply's words once
    per reply and a marker ring on the point while it asks. y: True. n: ActionError, which reaches the
    model as the next observation. q or the stop hotkey: the run ends. Anything else (Enter, the end of
    input) is q in confirm mode and n under --yes."""

    def __init__(self, guard: Guard, desktop: DesktopExecutor, marker=None, stream=None):
        self.guard, self.desktop, self.marker, self.stream = guard, desktop, marker, stream
        self._reply: str | None = None

    def on_event(self, event) -> None:
        if event.kind == "reply":
            self._reply = event.message

    def __call__(self, action: A.Action, pixels: Pixels, shot: Screenshot) -> bool:
        self.desktop.validate(action)  # a key this keyboard lacks is refused now, not after a "y"
        stop_chord = self.guard.stop_chord
        question = confirm_question(action, pixels, self._reply or "", stop_chord)  # as the tray's dialog asks
        self._reply = None  # the model's words once per reply, before its first action
        if question.reason:
            text = printable(question.reason, keep="\n").replace("\n", "\n    ")
            print(f"qvl-agent: the model says:\n    {text}", file=sys.stderr, flush=True)
        why = system_chord(action.keys, stop_chord) if isinstance(action, A.Key) else ""
        warning = f" WARNING: {question.warning}." if question.warning else ""
        marked = bool(pixels) and self.marker is not None and self.marker.show(*pixels[0], A.describe(action))
        where = " (marked on the screen)" if marked else ""
        prompt = PROMPTS.get(self.guard.mode, PROMPTS["confirm"])
        print(f"qvl-agent: it will {printable(question.doing)}{where}.{warning} {HELP} {prompt}",
              end="", file=sys.stderr, flush=True)  # fmt: skip
        try:
            answer = read_line(sys.stdin if self.stream is None else self.stream, self.guard.switch).strip().lower()
        finally:
            if marked:
                self.marker.hide()
        if self.guard.switch.is_set():
            print(file=sys.stderr, flush=True)  # end the prompt's line before the stop message
            return False
        if answer in ("y", "yes"):
            return True
        if answer in ("n", "no") or (answer not in ("q", "quit") and self.guard.mode == "auto"):
            if why:
                raise ActionError(
                    f"{A.describe(action)} was refused: {why}. Reach the goal without system key combinations."
                )
            raise ActionError(declined_message(action))
        self.guard.stop(f"The person ended the run at: {describe_pixels(action, pixels)}.")
        return False


def register(sub) -> None:
    p = sub.add_parser("run", help="carry out a task on the desktop", description=__doc__.splitlines()[0])
    add_engine_args(p)
    p.add_argument(
        "--planner",
        metavar="MODEL",
        help="a model (id or folder, openai:URL or replay:FILE) that says what to do, while --model only says "
        "where (needed when --model only grounds, e.g. --profile ui-venus-1.5)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--yes", action="store_true", help="run every action without asking")
    mode.add_argument(
        "--dry-run", action="store_true", help="show what would be done; touch nothing (exit 3 when it finishes)"
    )
    p.add_argument("--allow-keys", action="store_true", help="press system key combinations without asking")
    p.add_argument("--max-steps", type=int, default=30, metavar="N", help="give up after N steps")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--monitor", type=int, metavar="N", help="work on monitor N only (1 = first)")
    where.add_argument("--region", metavar="X,Y,W,H", help="work inside this rectangle only (pixels)")
    p.add_argument("--trace-dir", metavar="DIR", help="write the run's trace here (default: a new folder)")
    add_secret_args(p)
    p.add_argument("task", nargs="+", metavar="TASK", help="what to do, in words")
    p.set_defaults(func=run)


def _check_monitor(monitor: int) -> None:
    """A run works on one monitor, so unlike `ask --screen` it takes no 0 (the whole desktop)."""
    count = len(list_monitors()) - 1
    if not 1 <= monitor <= count:
        choices = monitor_choices(count)
        raise UsageError(f"There is no monitor {monitor} to work on: use {choices} (or --region X,Y,W,H).")


def run(args: argparse.Namespace, settings: Settings) -> int:
    task = task_and_steps(args, 'qvl-agent run "Open the settings"')
    check_engine(settings)  # a missing replay file is one sentence before anything else happens
    check_agent_model(settings, args.planner)
    secrets = secrets_from_args(args)
    region = Region.parse(args.region) if args.region else None
    if args.monitor is not None:
        _check_monitor(args.monitor)
    mode = "auto" if args.yes else "dry-run" if args.dry_run else settings.safety_mode
    hotkey = settings.hotkeys.stop
    dry = "DRY RUN: " if mode == "dry-run" else ""

    guard = Guard.for_settings(
        settings,
        mode,
        confine=region,
        hotkey=hotkey,
        allow_keys=args.allow_keys,
    )
    desktop = DesktopExecutor(monitor=args.monitor, region=region, interrupt=guard.switch.check)
    executor = DryRunExecutor(desktop) if mode == "dry-run" else desktop
    marker = TerminalMarker() if mode == "confirm" else None
    confirm = TerminalConfirm(guard, desktop, marker)
    guard.confirm = confirm  # also what --yes asks about system key combinations

    def on_event(event) -> None:
        confirm.on_event(event)
        print_event(event, prefix=dry)

    trace_dir = Path(args.trace_dir) if args.trace_dir else default_trace_dir()
    trace = takeover = None
    try:
        # Capture and the stop hotkey before loading a model: what cannot work fails in milliseconds.
        first = executor.observe()
        if region is None:
            guard.confine = first.region  # --monitor N confines actions to that monitor
        problem = guard.start()
        if problem and mode == "auto":
            raise UsageError(f"{problem} --yes runs only with a working emergency stop: run without --yes "
                             "to confirm each action.")  # fmt: skip
        engine = open_agent_engine(
            settings, args.planner, notify
        )  # before the first line below, so a load error is the only line
        if dry:
            print("qvl-agent: DRY RUN: nothing will be clicked or typed; each action is only shown.",
                  file=sys.stderr, flush=True)  # fmt: skip
        elif problem:
            print(f"qvl-agent: {problem} Press Ctrl+C here to stop.", file=sys.stderr, flush=True)
        else:
            print(f"qvl-agent: press {hotkey_label(hotkey)} to stop at any moment.", file=sys.stderr, flush=True)
        trace = TraceWriter(trace_dir)
        # The person's own hotkeys are no steps of theirs.
        person = desktop_person(trace, secrets, every_hotkey(settings.hotkeys))
        takeover = start_takeover(settings, guard.switch, person, where="the desktop")
        with engine:
            agent = Agent(
                engine,
                executor,
                guard,
                trace,
                max_steps=args.max_steps,
                on_event=on_event,
                options=GenerationOptions(max_new_tokens=settings.max_new_tokens),
                secrets=secrets,
                takeover=takeover,
            )
            masks_what_the_person_typed(takeover, agent)
            result = agent.run(task)
            for note in getattr(person, "problems", []):
                print(f"qvl-agent: note: {note}", file=sys.stderr, flush=True)
    except (QvlError, KeyboardInterrupt) as exc:
        if trace is not None:  # the folder exists: it says how the run ended
            end_run_early(trace, exc, task=task, engine=settings.engine, executor=executor.name, mode=mode)
        raise
    finally:
        if takeover is not None:
            takeover.close()
        guard.close()
        executor.close()
        if marker is not None:
            marker.close()
        if trace is not None:
            trace.close()

    print_result(result, trace_dir, prefix=dry)
    print_report(trace_dir)
    return run_exit_code(result)
