"""Which Chromium to launch: the one the person named (`--browser`, then the `browser` setting or
`QVL_BROWSER`), else Playwright's own, else one installed on the system. The browser executor, `doctor`,
the evaluation harnesses and the tests all find it this way.
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


def find_browser(explicit: str | None = None, configured: str = "", playwright_default: str | None = None) -> str:
    """The Chromium to launch: --browser PATH, then settings.browser (QVL_BROWSER), then Playwright's own
    install, then a system Chromium. BrowserError when there is none."""
    for path, origin in ((explicit, "--browser"), (configured, "QVL_BROWSER / the browser setting")):
        if path:
            found = shutil.which(path) or (path if Path(path).is_file() else None)
            if not found:
                raise BrowserError(f"The browser {path} given by {origin} does not exist or cannot be run.")
            return found
    if playwright_default and Path(playwright_default).is_file():
        return playwright_default
    for name in SYSTEM_CHROMIUMS:
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    raise BrowserError(
        "No Chromium was found: pass --browser PATH, set QVL_BROWSER, run `playwright install chromium`, "
        "or install a system Chromium."
    )
