"""`qvl-agent playwright`: the model writes a Playwright script for a task on a page.

    qvl-agent playwright --url URL [-o FILE] [--verify] [--attempts N] [--timeout S]
                         [--model ...] [--engine ...] [--browser PATH] TASK

The model sees the page's screenshot and its accessibility snapshot and answers with a script. Every
script passes `playwright.policy.check_script` before anything else happens to it; a refused script goes back
to the model with the reason. Nothing runs without --verify: with it, the script runs in a subprocess
(its own fresh headless Chromium, a scratch working folder, a timeout), and when it fails its error goes
back to the model, at most --attempts times in all. The accepted script goes to FILE (-o) or stdout.
Exit 0 with a script (verified when asked), 1 when no attempt passed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qvl_agent.cli import add_engine_args
from qvl_agent.config import Settings
from qvl_agent.engine import GenerationOptions, open_engine
from qvl_agent.errors import UsageError
from qvl_agent.playwright.scripts import write_script


def register(sub) -> None:
    p = sub.add_parser(
        "playwright", help="have the model write a Playwright script", description=__doc__.splitlines()[0]
    )
    p.add_argument("--url", required=True, help="the page the script starts on")
    p.add_argument("-o", "--output", metavar="FILE", help="write the script here (default: print it)")
    p.add_argument("--verify", action="store_true", help="run each script in a fresh headless browser")
    p.add_argument("--attempts", type=int, default=3, metavar="N", help="scripts to try at most (default 3)")
    p.add_argument("--timeout", type=float, default=60, metavar="S", help="seconds a verification may run")
    p.add_argument("--viewport", default="1280x800", metavar="WxH", help="page size in CSS pixels")
    p.add_argument("--browser", metavar="PATH", help="Chromium (default: $QVL_BROWSER, or find one)")
    add_engine_args(p)
    p.add_argument("task", nargs="+", metavar="TASK", help="what the script should do, in words")
    p.set_defaults(func=playwright_command)


def playwright_command(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.act.browser import BrowserExecutor, parse_viewport

    task = " ".join(args.task).strip()
    if not task:
        raise UsageError("The task is empty: say what the script should do.")
    if not args.url.startswith(("http://", "https://", "file://")):
        raise UsageError(f"--url must start with http://, https:// or file://, not {args.url!r}.")
    if not 1 <= args.attempts <= 10:
        raise UsageError(f"--attempts must be from 1 to 10, not {args.attempts}.")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout:g}.")
    viewport = parse_viewport(args.viewport)
    output = Path(args.output) if args.output else None
    if output is not None and not output.parent.resolve().is_dir():
        raise UsageError(f"Cannot write the script to {output}: the folder {output.parent} does not exist.")

    # Look at the page once, then close that browser: verification uses a fresh one for every script.
    executor = BrowserExecutor(args.url, browser=args.browser, configured_browser=settings.browser, viewport=viewport)
    try:
        shot = executor.observe()
        snapshot = executor.aria_snapshot()
        browser = executor.executable
    finally:
        executor.close()

    with open_engine(settings) as engine:
        outcome = write_script(
            engine,
            shot,
            url=args.url,
            task=task,
            snapshot=snapshot,
            viewport=viewport,
            attempts=args.attempts,
            verify=args.verify,
            browser=browser,
            timeout_s=args.timeout,
            options=GenerationOptions(max_new_tokens=max(settings.max_new_tokens, 2048)),
        )
    for line in outcome.attempts:
        print(f"qvl-agent: {line}", file=sys.stderr, flush=True)
    if not outcome.ok:
        print(f"qvl-agent: no script passed in {args.attempts} attempts; none was written.", file=sys.stderr)
        return 1
    if output is None:
        sys.stdout.write(outcome.script)
    else:
        output.write_text(outcome.script, encoding="utf-8")
        print(f"qvl-agent: wrote {output}", file=sys.stderr)
    if not args.verify:
        print("qvl-agent: the script was checked by the policy but not run (use --verify).", file=sys.stderr)
    return 0
