"""Model-written Playwright scripts: pull the script out of a reply, check it against the policy, verify
it by running it, and feed every failure back to the model, a bounded number of times.

Nothing here parses flags or prints: `commands/playwright.py` and the tray's script button call
`write_script` and show its `Outcome`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent import prompts
from qvl_agent.engine import Engine, GenerationOptions
from qvl_agent.image import Screenshot
from qvl_agent.parse import code_blocks
from qvl_agent.playwright.policy import ScriptRejected, check_script

MAX_ERROR_CHARS = 1500  # what goes back to the model from a failed run


def extract_script(reply: str) -> str:
    """The Python code in a reply: the longest ```python block, else the whole reply."""
    blocks = [b.strip() for b in code_blocks(reply, ("python", "py", "python3", "")) if b.strip()]
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
