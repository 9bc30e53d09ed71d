"""The Chromium command-line flags qvl-agent passes, in one place that imports nothing but the standard
library (the export compiler uses it without Playwright)."""

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
