"""The Chromium command-line flags qvl-agent passes, in one place that imports nothing but the standard
library (the script policy and the export compiler use it without Playwright)."""

from __future__ import annotations

# Sandboxed machines have no network: keep Chromium from phoning home and stalling on timeouts. The
# browser executor and every exported script launch Chromium with exactly these.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
)

# What a model-written script may pass as `args=`: the flags above and a few more that only turn things
# off. Anything else is refused, since flags such as --renderer-cmd-prefix make Chromium run programs.
SAFE_CHROMIUM_ARGS: tuple[str, ...] = CHROMIUM_ARGS + (
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
)
