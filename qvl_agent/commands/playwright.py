"""`qvl-agent playwright`: the model writes a Playwright script for a task on a page.

    qvl-agent playwright --url URL [-o FILE] [--verify [--unsafe-verify]] [--attempts N] [--timeout S]
                         [--model ...] [--engine ...] [--browser PATH] TASK

The model sees the page's screenshot and its accessibility snapshot and answers with a script. Every
script passes `playwright.policy.check_script` before anything else happens to it; a refused script goes back
to the model with the reason. Nothing runs without --verify: with it, the script runs inside a bubblewrap
sandbox (`playwright.sandbox`: its own fresh headless Chromium, a scratch folder, the page's origin as its
only network peer, a timeout), and when it fails its last error lines go back to the model, at most
--attempts times in all. Without bubblewrap, --verify refuses unless --unsafe-verify is given. The
accepted script goes to FILE (-o) or stdout, its first lines saying to run it with `qvl-agent replay`;
the files it wrote go into a new folder beside it (FILE's name + `.verified`); when every attempt failed,
the last one goes to OUT.rejected.py. Exit 0 with a script (verified when asked), 1 when no attempt
passed, 2 on bad usage or no sandbox.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qvl_agent.actions import printable
from qvl_agent.cli import add_engine_args, check_url
from qvl_agent.config import Settings
from qvl_agent.engine import GenerationOptions, open_engine
from qvl_agent.errors import SandboxUnavailable, UsageError
from qvl_agent.sandbox import bubblewrap
from qvl_agent.sandbox.copy_back import keep_files
from qvl_agent.scripts.header import script_origins, with_header
from qvl_agent.scripts.write.writer import rejected_path, save_script, write_script


def register(sub) -> None:
    p = sub.add_parser(
        "playwright", help="have the model write a Playwright script", description=__doc__.splitlines()[0]
    )
    p.add_argument("--url", required=True, metavar="URL", help="the page the script starts on")
    p.add_argument("-o", "--output", metavar="FILE", help="write the script here (default: print it)")
    p.add_argument("--verify", action="store_true", help="run each script in a fresh headless browser")
    p.add_argument(
        "--unsafe-verify",
        action="store_true",
        help="with --verify: run model-written scripts with ALL your rights when bubblewrap is not available "
        "(nothing else stands in their way: the lint is advice, not protection)",
    )
    p.add_argument("--attempts", type=int, default=3, metavar="N", help="scripts to try at most")
    p.add_argument("--timeout", type=float, default=60, metavar="SECONDS", help="seconds a verification may run")
    p.add_argument("--viewport", default="1280x800", metavar="WxH", help="page size in CSS pixels")
    p.add_argument("--browser", metavar="FILE", help="Chromium (default: $QVL_BROWSER, or find one)")
    add_engine_args(p)
    p.add_argument("task", nargs="+", metavar="TASK", help="what the script should do, in words")
    p.set_defaults(func=playwright_command)


def playwright_command(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.act.browser import BrowserExecutor, parse_viewport

    task = " ".join(args.task).strip()
    if not task:
        raise UsageError("The task is empty: say what the script should do.")
    url = check_url(args.url)
    if not 1 <= args.attempts <= 10:
        raise UsageError(f"--attempts must be from 1 to 10, not {args.attempts}.")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout:g}.")
    if args.unsafe_verify and not args.verify:
        raise UsageError("--unsafe-verify only goes with --verify.")
    unsafe = False
    if args.verify:
        problem = bubblewrap.bubblewrap_problem()
        if problem and not args.unsafe_verify:
            raise SandboxUnavailable(f"--verify runs model-written scripts only inside a sandbox: {problem}")
        if problem:
            unsafe = True
            print(
                f"qvl-agent: warning: {problem} Model-written scripts will run with all your rights, unsandboxed "
                "(--unsafe-verify).",
                file=sys.stderr,
            )
    viewport = parse_viewport(args.viewport)
    output = Path(args.output) if args.output else None
    if output is not None and not output.parent.resolve().is_dir():
        raise UsageError(f"Cannot write the script to {output}: the folder {output.parent} does not exist.")

    # Look at the page once, then close that browser: verification uses a fresh one for every script.
    executor = BrowserExecutor(url, browser=args.browser, configured_browser=settings.browser, viewport=viewport)
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
            url=url,
            task=task,
            snapshot=snapshot,
            viewport=viewport,
            attempts=args.attempts,
            verify=args.verify,
            browser=browser,
            timeout_s=args.timeout,
            options=GenerationOptions(max_new_tokens=max(settings.max_new_tokens, 2048)),
            unsafe=unsafe,
            memory_mb=settings.sandbox_memory_mb,
        )
    for line in outcome.attempts:  # the script's own output among them: escaped, it drives no terminal
        print(f"qvl-agent: {printable(line, keep=chr(10))}", file=sys.stderr, flush=True)
    if not outcome.ok:
        kept = ""
        if output is not None and outcome.script:
            rejected = rejected_path(output)
            rejected.write_text(with_header(outcome.script, rejected.name, script_origins(url)), encoding="utf-8")
            rejected.chmod(0o600)
            kept = f" The last attempt is in {rejected}."
        print(f"qvl-agent: no script passed in {args.attempts} attempts; none was written.{kept}", file=sys.stderr)
        return 1
    if output is None:
        sys.stdout.write(with_header(outcome.script, "SCRIPT.py", script_origins(url)))
        files = keep_files(outcome.files, Path.cwd() / "qvl-script.verified")
    else:
        files = save_script(outcome, output, url)
        print(f"qvl-agent: wrote {output}; run it with: qvl-agent replay {output}", file=sys.stderr)
    for path in files.written:
        print(f"qvl-agent: kept {printable(str(path))} (written by the script when it was verified)", file=sys.stderr)
    for name in files.refused:
        print(
            f"qvl-agent: not kept {printable(name)}: only documents, data and media files are copied, into a new "
            "folder, never a hidden, runnable or instruction file",
            file=sys.stderr,
        )
    if not args.verify:
        print("qvl-agent: the script was checked by the policy but not run (use --verify).", file=sys.stderr)
    return 0
