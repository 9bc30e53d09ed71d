"""Model-written Playwright scripts: pull the script out of a reply, check it against the policy, verify
it by running it in the bubblewrap sandbox (`sandbox.py`), and feed every failure back to the model (the
script's own last error lines), a bounded number of times. Files a verified script wrote are kept beside
it (`save_script`); the last rejected attempt goes to OUT.rejected.py (`rejected_path`).

Nothing here parses flags or prints: `commands/playwright.py` and the tray's script button call
`write_script` and show its `Outcome`.
"""

from __future__ import annotations

import os
import re
import signal
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
from qvl_agent.playwright import sandbox
from qvl_agent.playwright.policy import ScriptRejected, check_script

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


def verify_script(source: str, url: str, browser: str, timeout_s: float, *, unsafe: bool = False) -> Verification:
    """Run a policy-checked script with its own fresh headless Chromium, within `timeout_s`.

    Normally inside the bubblewrap sandbox (`sandbox.run_sandboxed`; raises SandboxUnavailable where it
    cannot start); with `unsafe`, as a plain subprocess with the person's rights."""
    run = _run_unsandboxed if unsafe else sandbox.run_sandboxed
    wait_ms = playwright_timeout_ms(timeout_s)
    result = run(source, url=url, browser=browser, timeout_s=timeout_s, default_timeout_ms=wait_ms)
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
        if line.lstrip().startswith("File ") and ("<frozen runpy>" in line or sandbox.INIT_INSIDE in line):
            skip_code = True
            continue
        kept.append(line)
    text = "\n".join(kept).strip()
    return text[-limit:]


def _run_unsandboxed(
    source: str, *, url: str, browser: str, timeout_s: float, default_timeout_ms: float
) -> sandbox.SandboxResult:
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
        command = [sys.executable, "-I", str(sandbox.INIT), "", "0", "", f"{default_timeout_ms:g}", "-", str(script)]
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
        output = sandbox.read_tail(log_path)
        log_path.unlink()
        script.unlink()
        return sandbox.SandboxResult(returncode, output, sandbox.collect_files(Path(scratch)))


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
) -> Outcome:
    """Ask for a script, check it, verify it when asked; feed each failure back, `attempts` times at most.

    Verification runs in the sandbox (raises SandboxUnavailable before asking the model when it cannot
    start), or with the person's rights when `unsafe`."""
    if verify and not unsafe:
        problem = sandbox.bubblewrap_problem()
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
                result = verify_script(source, url, browser, timeout_s, unsafe=unsafe)
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
        own = [i for i in frames if sandbox.SCRIPT_INSIDE in body[i]]
        if exception is not None:
            where = body[own[-1] : own[-1] + 2] if own else []
            shown = where + body[exception : exception + lines - len(where)]
    return "\n".join([head, *("    " + line.strip() for line in shown)])


# Files a script commonly makes (screenshots, PDFs, videos), which may replace an older file of the same name.
REPLACEABLE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".pdf", ".webm", ".har"})
# What is kept at all: documents, data and media. A page can serve a download under any name, and a file
# that something runs by itself (conftest.py, a Makefile, a .desktop launcher, package.json's scripts) must
# not reach the person's folder from a test run.
KEPT_SUFFIXES = REPLACEABLE_SUFFIXES | frozenset(
    {".gif", ".webp", ".bmp", ".txt", ".csv", ".tsv", ".json", ".xml", ".md", ".log", ".zip", ".gz", ".tgz",
     ".xlsx", ".xls", ".docx", ".doc", ".pptx", ".odt", ".ods", ".odp", ".rtf", ".mp4", ".mp3", ".wav", ".ogg",
     ".ics", ".vcf", ".parquet"}
)  # fmt: skip
NEVER_KEPT_NAMES = frozenset({"package.json", "composer.json", "deno.json"})  # their scripts run on install


def save_script(outcome: Outcome, path: Path) -> list[Path]:
    """Write the accepted script to `path` and keep the files its verification wrote beside it."""
    path.write_text(outcome.script, encoding="utf-8")
    return keep_files(outcome.files, path.parent, protect=path)


def keep_files(files: dict[str, bytes], folder: Path, protect: Path | None = None) -> list[Path]:
    """Write the files a verified script made (screenshots, PDFs, downloads) into `folder` at their relative
    paths; returns their paths. A model-written script chose these names, so only documents, data and media
    are kept (`KEPT_SUFFIXES`), no hidden name (`.bashrc`, `.config/...`), nothing outside `folder` (a link
    to a folder elsewhere is not followed), and no existing file is replaced unless it is a screenshot, PDF
    or video."""
    written = []
    inside = folder.resolve()
    for name, data in files.items():
        parts = Path(name).parts
        if any(part.startswith(".") for part in parts):
            continue
        if Path(name).suffix.lower() not in KEPT_SUFFIXES or Path(name).name.lower() in NEVER_KEPT_NAMES:
            continue
        target = folder.joinpath(*parts)
        if (protect is not None and target.resolve() == protect.resolve()) or target.is_symlink():
            continue
        if not target.resolve().is_relative_to(inside):
            continue
        if target.exists() and (target.suffix.lower() not in REPLACEABLE_SUFFIXES or not target.is_file()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target)
    return written


def rejected_path(output: Path) -> Path:
    """Where the last attempt goes when no script passed: OUT.rejected.py beside OUT."""
    return output.with_name(output.name.removesuffix(".py") + ".rejected.py")
