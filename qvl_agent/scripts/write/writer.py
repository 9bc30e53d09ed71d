"""Model-written Playwright scripts: pull the script out of a reply, check it against the policy, verify
it by running it in the bubblewrap sandbox (`bubblewrap.py`), and feed every failure back to the model (the
script's own last error lines), a bounded number of times. Files a verified script wrote are kept in a
new folder beside it (`save_script`, `copy_back.keep_files`); the last rejected attempt goes to
OUT.rejected.py (`rejected_path`).

Nothing here parses flags or prints: `commands/playwright.py` and the tray's script button call
`write_script` and show its `Outcome`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent import prompts
from qvl_agent.engine import Engine, GenerationOptions
from qvl_agent.errors import SandboxUnavailable
from qvl_agent.image import Screenshot
from qvl_agent.parse import code_blocks
from qvl_agent.sandbox import bubblewrap, watchdog
from qvl_agent.sandbox.copy_back import Kept, keep_files
from qvl_agent.sandbox.watchdog import walk
from qvl_agent.scripts.header import script_origins, with_header
from qvl_agent.scripts.write.policy import ScriptRejected, check_script

MAX_ERROR_CHARS = 1500  # what goes back to the model from a failed run


def extract_script(reply: str) -> str:
    """The Python code in a reply: the longest ```python block, else the whole reply. A lone surrogate (a
    remote server's JSON "\\ud800") becomes U+FFFD, as a UTF-8 decoder would make it: the script must be
    text that can be saved and parsed."""
    reply = re.sub("[\ud800-\udfff]", "\ufffd", reply)
    blocks = [b.strip() for b in code_blocks(reply, ("python", "py", "python3", "")) if b.strip()]
    if blocks:
        return max(blocks, key=len) + "\n"
    return reply.strip() + "\n"


@dataclass(frozen=True)
class Verification:
    ok: bool
    error: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # what the script wrote in its scratch folder


def playwright_timeout_ms(timeout_s: float) -> float:
    """Playwright's default wait inside a verification: a third of the run's time (at most Playwright's own
    30 s), so a wrong locator fails with Playwright's message, naming the locator, before the run's
    timeout ends everything with no message at all."""
    return max(500.0, min(30_000.0, timeout_s * 1000 / 3))


def verify_script(
    source: str, url: str, browser: str, timeout_s: float, *, unsafe: bool = False, memory_mb: int | None = None
) -> Verification:
    """Run a script with its own fresh headless Chromium, within `timeout_s`.

    Inside the bubblewrap sandbox (`bubblewrap.run_sandboxed`; raises SandboxUnavailable where it cannot
    start), its memory capped at `memory_mb` in all; only with `unsafe`, which the person asked for by
    name (--unsafe-verify), as a plain subprocess with their rights."""
    wait_ms = playwright_timeout_ms(timeout_s)
    if unsafe:
        result = _run_unsandboxed(source, url=url, browser=browser, timeout_s=timeout_s, default_timeout_ms=wait_ms)
    else:
        memory = (memory_mb << 20) if memory_mb else watchdog.MEMORY_BYTES
        result = bubblewrap.run_sandboxed(
            source, url=url, browser=browser, timeout_s=timeout_s, default_timeout_ms=wait_ms, memory_bytes=memory
        )
    if result.returncode == 0:
        return Verification(True, files=result.files)
    tail = last_error_lines(result.output)
    if result.limit:
        return Verification(False, f"it was stopped because {result.limit}" + (f":\n{tail}" if tail else ""))
    if result.returncode is None:
        return Verification(False, f"it did not finish within {timeout_s:g} seconds" + (f":\n{tail}" if tail else ""))
    return Verification(False, f"it exited with status {result.returncode}:\n{tail or '(no output)'}")


def last_error_lines(output: str, limit: int = MAX_ERROR_CHARS) -> str:
    """The end of a script's output, its traceback without the launcher's own frames, in `limit` chars."""
    lines = output.rstrip().splitlines()
    kept: list[str] = []
    skip_code = False
    for line in lines:
        if skip_code:
            skip_code = False
            if line.startswith("    ") and not line.lstrip().startswith("File "):
                continue
        if line.lstrip().startswith("File ") and ("<frozen runpy>" in line or bubblewrap.INIT_INSIDE in line):
            skip_code = True
            continue
        kept.append(line)
    text = "\n".join(kept).strip()
    return text[-limit:]


def _run_unsandboxed(
    source: str, *, url: str, browser: str, timeout_s: float, default_timeout_ms: float
) -> bubblewrap.SandboxResult:
    """Today's behaviour for --unsafe-verify: the person's own rights, a scratch cwd, a timeout."""
    with tempfile.TemporaryDirectory(prefix="qvl-verify-") as scratch:
        script = Path(scratch) / "script.py"
        script.write_text(source, encoding="utf-8")
        log_path = Path(scratch) / ".output.log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": scratch,
            "QVL_BROWSER": browser,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        spec = {"relays": [], "timeout_ms": default_timeout_ms, "script": str(script), "files_fd": None}
        command = [sys.executable, "-I", str(bubblewrap.INIT), json.dumps(spec)]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,  # its own process group: a timeout ends the browser it started too
            )  # fmt: skip
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
        output = bubblewrap.read_tail(log_path)
        log_path.unlink()
        script.unlink()
        return bubblewrap.SandboxResult(returncode, output, _files_in(Path(scratch)))


def _files_in(folder: Path, budget: int = bubblewrap.COPY_BYTES) -> dict[str, bytes]:
    """The regular files under `folder` (links never followed), up to `budget` bytes in all."""
    files: dict[str, bytes] = {}
    for path, info in walk(folder):
        if stat.S_ISREG(info.st_mode) and 0 <= info.st_size <= budget:
            try:
                data = path.read_bytes()[: budget + 1]
            except OSError:
                continue
            if len(data) <= budget:
                budget -= len(data)
                files[str(path.relative_to(folder))] = data
    return files


@dataclass
class Outcome:
    script: str = ""
    ok: bool = False
    attempts: list[str] = field(default_factory=list)  # one line per attempt, for the person
    files: dict[str, bytes] = field(default_factory=dict)  # what the verified script wrote, to keep beside it


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
    unsafe: bool = False,
    memory_mb: int | None = None,
) -> Outcome:
    """Ask for a script, check it, verify it when asked; feed each failure back, `attempts` times at most.

    Verification runs in the sandbox (raises SandboxUnavailable before asking the model when it cannot
    start), or with the person's rights when `unsafe`."""
    if verify and not unsafe:
        problem = bubblewrap.bubblewrap_problem()
        if problem:
            raise SandboxUnavailable(f"Refusing to run model-written scripts without the sandbox: {problem}")
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
                result = verify_script(source, url, browser, timeout_s, unsafe=unsafe, memory_mb=memory_mb)
                if result.ok:
                    outcome.attempts.append(f"attempt {n}: passed the policy and verification")
                    outcome.script, outcome.ok, outcome.files = source, True, result.files
                    return outcome
                error = f"running it failed: {result.error}"
            outcome.attempts.append(f"attempt {n}: {_summary(error)}")
            outcome.script = source
            text = prompts.load("playwright_retry").render(error=error)
    finally:
        session.close()
    return outcome


def _summary(error: str, lines: int = 6) -> str:
    """An attempt's error for the person: its first line, then the script's own line that failed and the
    exception (or, without a traceback, the output's last lines), indented."""
    head, _, rest = error.partition("\n")
    body = [line for line in rest.splitlines() if line.strip()]
    frames = [i for i, line in enumerate(body) if line.lstrip().startswith("File ")]
    shown = body[-lines:]
    if frames:
        exception = next((i for i in range(frames[-1] + 1, len(body)) if not body[i].startswith(" ")), None)
        own = [i for i in frames if bubblewrap.SCRIPT_INSIDE in body[i]]
        if exception is not None:
            where = body[own[-1] : own[-1] + 2] if own else []
            shown = where + body[exception : exception + lines - len(where)]
    return "\n".join([head, *("    " + line.strip() for line in shown)])


def save_script(outcome: Outcome, path: Path, url: str) -> Kept:
    """Write the accepted script to `path`, with the header that says how to run it and which origin it was
    made for, and keep the files its verification wrote in a new folder beside it (`PATH.verified/`)."""
    path.write_text(with_header(outcome.script, path.name, script_origins(url)), encoding="utf-8")
    path.chmod(0o600)
    return keep_files(outcome.files, path.with_name(path.stem + ".verified"))


def rejected_path(output: Path) -> Path:
    """Where the last attempt goes when no script passed: OUT.rejected.py beside OUT."""
    return output.with_name(output.name.removesuffix(".py") + ".rejected.py")
