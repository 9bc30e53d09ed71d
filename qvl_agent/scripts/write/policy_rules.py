"""The script lint's tables (advice for the model, not a security boundary: see `policy.py`). Data only."""

from __future__ import annotations

# Modules a Playwright script has no use for, with the reason the model is told.
NOT_NEEDED_MODULES = {
    "subprocess": "a Playwright script drives the page, it runs no other programs",
    "pty": "a Playwright script drives the page, it runs no other programs",
    "multiprocessing": "one browser is enough; Playwright waits for the page itself",
    "socket": "talk to the page through Playwright (page.goto, page.request)",
    "ctypes": "a Playwright script needs no native code",
    "requests": "fetch through Playwright instead: page.request.get(url)",
    "httpx": "fetch through Playwright instead: page.request.get(url)",
    "urllib3": "fetch through Playwright instead: page.request.get(url)",
    "urllib.request": "fetch through Playwright instead: page.request.get(url)",
    "http.client": "fetch through Playwright instead: page.request.get(url)",
    "selenium": "use Playwright's sync API",
    "pyppeteer": "use Playwright's sync API",
}

# os functions that run other programs.
OS_PROGRAM_RUNNERS = frozenset(
    {"system", "popen", "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl",
     "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp",
     "fork", "forkpty"}
)  # fmt: skip

# Builtins that run code from text.
CODE_FROM_TEXT = frozenset({"eval", "exec", "compile", "__import__"})

# Playwright calls that attach to a browser that is not the fresh one the script launches.
ATTACHING = frozenset({"connect", "connect_over_cdp", "launch_server"})

# Playwright calls whose path= is a file the script writes.
WRITES_TO_PATH = frozenset({"screenshot", "pdf", "save_as"})
