"""`qvl-agent playwright`: the model writes a Playwright script for a task on a page.

    qvl-agent playwright --url URL [-o FILE] [--verify] [--attempts N] [--timeout S]
                         [--model ...] [--engine ...] [--browser PATH] TASK

The model sees the page's screenshot and its accessibility snapshot and answers with a script. Every
script passes `script_policy.check_script` before anything else happens to it; a refused script goes back
to the model with the reason. Nothing runs without --verify: with it, the script runs in a subprocess
(its own fresh headless Chromium, a scratch working folder, a timeout), and when it fails its error goes
back to the model, at most --attempts times in all. The accepted script goes to FILE (-o) or stdout.
Exit 0 with a script (verified when asked), 1 when no attempt passed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent import prompts
from qvl_agent.capture import Screenshot
from qvl_agent.cli import add_engine_args
from qvl_agent.config import Settings
from qvl_agent.engine import Engine, GenerationOptions, open_engine
from qvl_agent.errors import UsageError
from qvl_agent.script_policy import ScriptRejected, check_script

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
MAX_ERROR_CHARS = 1500  # what goes back to the model from a failed run


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


def extract_script(reply: str) -> str:
    """The Python code in a reply: the longest ```python block, else the whole reply."""
    blocks = [b.strip() for b in _FENCE.findall(reply) if b.strip()]
    if blocks:
        return max(blocks, key=len) + "\n"
    return reply.strip() + "\n"


@dataclass(frozen=True)
class Verification:
    ok: bool
    error: str = ""


def verify_script(source: str, browser: str, timeout_s: float) -> Verification:
    """Run a policy-checked script in a subprocess: scratch cwd, fresh headless Chromium, a timeout."""
    with tempfile.TemporaryDirectory(prefix="qvl-verify-") as scratch:
        script = Path(scratch) / "script.py"
        script.write_text(source, encoding="utf-8")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": scratch,
            "QVL_BROWSER": browser,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        proc = subprocess.Popen(
            [sys.executable, "-I", str(script)],
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: a timeout ends the browser it started too
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Verification(False, f"it did not finish within {timeout_s:g} seconds")
    if proc.returncode == 0:
        return Verification(True)
    tail = (err or out).strip()
    tail = tail[-MAX_ERROR_CHARS:] if tail else "(no output)"
    return Verification(False, f"it exited with status {proc.returncode}:\n{tail}")


@dataclass
class Outcome:
    script: str = ""
    ok: bool = False
    attempts: list[str] = field(default_factory=list)  # one line per attempt, for the person


def write_script(
    engine: Engine,
    shot: Screenshot,
    *,
    url: str,
    task: str,
    snapshot: str,
    viewport: tuple[int, int],
    attempts: int,
    verify: bool,
    browser: str,
    timeout_s: float,
    options: GenerationOptions | None = None,
) -> Outcome:
    """Ask for a script, check it, verify it when asked; feed each failure back, `attempts` times at most."""
    session = engine.open_session()
    outcome = Outcome()
    text = prompts.load("playwright_script").render(
        url=url, task=task, snapshot=snapshot or "(empty)", viewport=f"{viewport[0]}x{viewport[1]}"
    )
    images: list[Screenshot] = [shot]
    try:
        for n in range(1, attempts + 1):
            reply = session.complete(text, images, options or GenerationOptions(max_new_tokens=2048))
            images = []
            source = extract_script(reply)
            try:
                check_script(source)
            except ScriptRejected as exc:
                error = f"the safety policy refused it: {exc}"
            else:
                if not verify:
                    outcome.attempts.append(f"attempt {n}: passed the policy (not run: no --verify)")
                    outcome.script, outcome.ok = source, True
                    return outcome
                result = verify_script(source, browser, timeout_s)
                if result.ok:
                    outcome.attempts.append(f"attempt {n}: passed the policy and verification")
                    outcome.script, outcome.ok = source, True
                    return outcome
                error = f"running it failed: {result.error}"
            outcome.attempts.append(f"attempt {n}: {error.splitlines()[0]}")
            outcome.script = source
            text = prompts.load("playwright_retry").render(error=error)
    finally:
        session.close()
    return outcome


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
