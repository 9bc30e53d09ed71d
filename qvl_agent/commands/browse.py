"""`qvl-agent browse`: carry out a task on a web page in Chromium, and compile the run into a script.

    qvl-agent browse --url URL [--model ...] [--engine ...] [--export FILE] [--headed]
                     [--viewport WxH] [--max-steps N] [--trace-dir DIR] [--browser PATH]
                     [--secret NAME ...] [--allow-domain HOST ...] TASK

The same agent loop and actions as `run`, carried out by Playwright in a fresh Chromium profile
(headless unless --headed), so nothing on the desktop is touched and no action needs a yes. Each step
prints the model's one-line reason, then its actions. Each click is resolved to a locator and recorded in
the trace. With --export FILE a successful run is compiled into a
standalone Playwright script that replays it without the model (`qvl-agent replay FILE`). --secret NAME: the model
types {{NAME}}, the browser gets $QVL_SECRET_NAME (the trace and the script never hold it).
--allow-domain HOST: navigation to any other host (the start URL's host is always allowed) is blocked and
reported to the model. A request carrying a secret's value (in any encoding) goes to those hosts only.
Exit 0 when the model ends with success, 1 on failure, a limit or a browser that died, 2 on bad usage,
130 on Ctrl+C. The run folder always ends with an outcome and report.html: "failed to start" when the
start page could not be opened, "interrupted" after Ctrl+C.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

from qvl_agent import capture
from qvl_agent.act.guard import Guard
from qvl_agent.agent import Agent
from qvl_agent.cli import (
    add_engine_args,
    add_secret_args,
    check_url,
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
from qvl_agent.config import Settings
from qvl_agent.engine import GenerationOptions, check_engine
from qvl_agent.errors import QvlError, UsageError
from qvl_agent.planner import check_agent_model, open_agent_engine
from qvl_agent.takeover import masks_what_the_person_typed
from qvl_agent.trace import PLAYWRIGHT_TRACE, TraceWriter, default_trace_dir


def register(sub) -> None:
    p = sub.add_parser("browse", help="carry out a task in a browser page", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, metavar="URL", help="the page to start on (http://, https:// or file://)")
    add_engine_args(p)
    p.add_argument(
        "--planner",
        metavar="MODEL",
        help="a model (id or folder, openai:URL or replay:FILE) that says what to do, while --model only says "
        "where (needed when --model only grounds, e.g. --profile ui-venus-1.5)",
    )
    p.add_argument("--export", metavar="FILE", help="write a Playwright script replaying a successful run")
    p.add_argument("--headed", action="store_true", help="show the browser window (default: headless)")
    p.add_argument("--viewport", default="1280x800", metavar="WxH", help="page size in CSS pixels")
    p.add_argument("--max-steps", type=int, default=30, metavar="N", help="give up after N steps")
    p.add_argument("--trace-dir", metavar="DIR", help="write the run's trace here (default: a new folder)")
    p.add_argument("--browser", metavar="FILE", help="Chromium (default: $QVL_BROWSER, or find one)")
    add_secret_args(p)
    p.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        metavar="HOST",
        help="allow navigation to HOST and its subdomains only (with the start URL's host); repeatable",
    )
    p.add_argument("task", nargs="+", metavar="TASK", help="what to do, in words")
    p.set_defaults(func=browse)


def _check_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    if not host or "/" in host or ":" in host or " " in host:
        raise UsageError(f"--allow-domain takes a host name such as example.com, not {host!r}.")
    return host


def _print_step(secrets, event) -> None:
    """The step's lines on the terminal, with the model's reason first; a secret's value in the reason (the
    model read it off the page) is shown as its placeholder."""
    if event.kind == "reply":
        event = dataclasses.replace(event, message=secrets.mask(event.message))
    print_event(event, reasons=True)


def _takeover(settings: Settings, guard, executor, trace, secrets):
    """Take over and hand back in a headed run: the stop hotkey listening (it ends a paused run too), the
    take-over hotkey, and the person's work recorded as steps of the run (`act.recorder.PersonCapture`)."""
    from qvl_agent.act.browser import playwright_key
    from qvl_agent.act.recorder import PersonCapture
    from qvl_agent.config import hotkey_keys, hotkey_label

    problem = guard.start()
    if problem:
        print(f"qvl-agent: note: {problem} Press Ctrl+C here to stop.", file=sys.stderr, flush=True)
    else:
        print(f"qvl-agent: press {hotkey_label(settings.hotkeys.stop)} to stop at any moment.",
              file=sys.stderr, flush=True)  # fmt: skip
    person = PersonCapture(executor, trace, secrets)
    # The hotkeys reach the page too: their presses are no step of the person's.
    hotkeys = (settings.hotkeys.takeover, settings.hotkeys.stop)
    person.forget = tuple(playwright_key(tuple(hotkey_keys(k))) for k in hotkeys)
    return start_takeover(settings, guard.switch, person, where="the page")


def browse(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.act.browser import BrowserExecutor, parse_viewport
    from qvl_agent.scripts.export.exporter import export_trace, write_browser_info

    task = task_and_steps(args, 'qvl-agent browse --url URL "Sign in"')
    check_engine(settings)  # a missing replay file is bad input, not a run that failed to start
    url = check_url(args.url)
    if args.headed and capture.display_kind() in ("none", "wayland"):  # Chromium's window needs an X display
        raise UsageError("--headed shows the browser window, but there is no display here (DISPLAY is not set): "
                         "run without --headed to browse headless.")  # fmt: skip
    check_agent_model(settings, args.planner)
    secrets = secrets_from_args(args)
    allowed = [_check_host(host) for host in args.allow_domain]
    viewport = parse_viewport(args.viewport)
    export = Path(args.export) if args.export else None
    if export is not None and not export.parent.resolve().is_dir():
        raise UsageError(f"Cannot write the script to {export}: the folder {export.parent} does not exist.")
    if export is not None and (export.exists() or export.is_symlink()):
        raise UsageError(f"{export} already exists: --export writes a new file (remove it or choose another name).")

    trace_dir = Path(args.trace_dir) if args.trace_dir else default_trace_dir()
    trace = TraceWriter(trace_dir)
    executor = takeover = guard = None
    playwright_trace = trace_dir / PLAYWRIGHT_TRACE
    if secrets:  # its page snapshots would hold what was typed, the secret's value included
        playwright_trace = None
        print(f"qvl-agent: no {PLAYWRIGHT_TRACE}: a run with a secret keeps no Playwright trace, whose page "
              "snapshots would hold the secret's value.", file=sys.stderr, flush=True)  # fmt: skip
    try:
        write_browser_info(trace_dir, url, viewport)
        # Start the browser before loading a model: no Chromium or a dead URL fails in a second.
        executor = BrowserExecutor(
            url,
            browser=args.browser,
            configured_browser=settings.browser,
            headless=not args.headed,
            viewport=viewport,
            allowed_domains=allowed,
            secrets=secrets,
            playwright_trace=playwright_trace,
        )
        # The run acts only inside its own fresh browser profile, so it does not ask before each action;
        # Ctrl+C in the terminal stops it. Keys reach the page, never the system, so no chord is refused.
        guard = Guard.for_settings(
            settings,
            "auto",
            allow_keys=True,
            hotkey=settings.hotkeys.stop if args.headed else None,
        )
        if args.headed:  # the person sees the page: the stop hotkey, and take over / hand back
            takeover = _takeover(settings, guard, executor, trace, secrets)
        with open_agent_engine(settings, args.planner, notify) as engine:
            agent = Agent(
                engine,
                executor,
                guard,
                trace,
                max_steps=args.max_steps,
                prompt_name="browser",
                on_event=functools.partial(_print_step, secrets),
                options=GenerationOptions(max_new_tokens=settings.max_new_tokens),
                secrets=secrets,
                takeover=takeover,
            )
            if takeover is not None:  # what the person typed into password fields is masked from then on
                masks_what_the_person_typed(takeover, agent)
            result = agent.run(task)
        if takeover is not None:
            secrets = takeover.person.secrets
            agent.typed.update(takeover.person.typed)
            for problem in takeover.person.problems:
                print(f"qvl-agent: note: {problem}", file=sys.stderr, flush=True)
        final = None
        if result.ok:
            try:
                final = secrets.mask(executor.final_state())
            except QvlError as exc:
                print(f"qvl-agent: the final page could not be checked: {exc}", file=sys.stderr)
        write_browser_info(trace_dir, url, viewport, final)
    except (QvlError, KeyboardInterrupt) as exc:
        if executor is not None:
            executor.close()  # trace.zip is saved before the report links it
        end_run_early(trace, exc, task=task, engine=settings.engine, executor="browser", mode="auto")
        raise
    finally:
        if takeover is not None:
            takeover.close()
        if guard is not None:
            guard.close()
        if executor is not None:
            executor.close()
        trace.close()

    print_result(result, trace_dir)
    print_report(trace_dir)
    if export is not None:
        if result.ok:
            # private (0600), never over a file; secrets read where the model typed their placeholders
            compiled = export_trace(trace_dir, export, replace=False, typed=agent.typed)
            print(f"qvl-agent: wrote {export}; replay it with: qvl-agent replay {export}", file=sys.stderr, flush=True)
            for note in compiled.unexpressed:
                print(f"qvl-agent: note: {note}", file=sys.stderr, flush=True)
        else:
            print(f"qvl-agent: {export} was not written: the run did not succeed.", file=sys.stderr)
    return run_exit_code(result)
