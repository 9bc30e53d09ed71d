"""Which Chromium to launch: the one the person named (`--browser`, then the `browser` setting or
`QVL_BROWSER`), else Playwright's own, else one installed on the system; for a run that shows no window,
Chromium's headless shell first where it is installed (as Playwright itself does: it starts in about a
third of the full browser's CPU time). The browser executor, `doctor`, the evaluation harnesses, the
sandbox's replays and the tests all find it this way.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from qvl_agent.errors import BrowserError

SYSTEM_CHROMIUMS = (
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
    "/usr/bin/chromium",
    "/snap/bin/chromium",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
    "/Applications/Chromium.app/Contents/MacOS/Chromium",
)

# Debian's chromium-headless-shell, Google's chrome-headless-shell: the same engine without a window.
HEADLESS_SHELLS = ("chromium-headless-shell", "chrome-headless-shell", "/usr/lib/chromium/chromium-headless-shell")


def find_browser(
    explicit: str | None = None,
    configured: str = "",
    playwright_default: str | None = None,
    *,
    headless: bool | None = None,
) -> str:
    """The Chromium to launch: --browser PATH, then settings.browser (QVL_BROWSER), then (for a headless
    run) a headless shell, then Playwright's own install, then a system Chromium. `headless`: the run shows
    no window (True), shows one (False: a headless shell is refused), or either (None). BrowserError when
    there is none."""
    for path, origin in ((explicit, "--browser"), (configured, "QVL_BROWSER / the browser setting")):
        if path:
            if not (found := _installed(path)):
                raise BrowserError(f"The browser {path} given by {origin} does not exist or cannot be run.")
            if headless is False and is_headless_shell(found):
                raise BrowserError(
                    f"The browser {path} given by {origin} is Chromium's headless shell, which shows no window: "
                    "name a full Chromium for a run with a window."
                )
            return found
    for name in HEADLESS_SHELLS if headless is True else ():
        if found := _installed(name):
            return found
    if playwright_default and Path(playwright_default).is_file():
        return playwright_default
    for name in SYSTEM_CHROMIUMS:
        if found := _installed(name):
            return found
    raise BrowserError(
        "No Chromium was found: pass --browser PATH, set QVL_BROWSER, run `playwright install chromium`, "
        "or install a system Chromium."
    )


def is_headless_shell(executable: str) -> bool:
    """Whether a Chromium is a headless shell, which cannot show a window."""
    return "headless-shell" in Path(executable).name or "headless_shell" in Path(executable).name


def _installed(name: str) -> str | None:
    return shutil.which(name) or (name if Path(name).is_file() else None)
