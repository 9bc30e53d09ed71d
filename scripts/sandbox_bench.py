"""What the verification sandbox costs: the same scripts run through `sandbox.bubblewrap.run_sandboxed` with
the kernel's limits (a cgroup and tmpfs sized in entries, where this machine gives them), through the
sandbox without them (the watchdog alone, as on a machine that gives none), and through the unsandboxed
path (`--unsafe-verify`); median/min/max wall time of N runs each.

    PYTHONPATH=. .venv/bin/python scripts/sandbox_bench.py [N]
"""

from __future__ import annotations

import http.server
import statistics
import sys
import threading
import time
from pathlib import Path
from unittest import mock

from qvl_agent.playwright.chromium import find_browser
from qvl_agent.sandbox import bubblewrap
from qvl_agent.scripts.write import writer

PAGES = Path(__file__).resolve().parent.parent / "tests" / "pages"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(PAGES), **kwargs)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/login.html"
    browser = find_browser()
    trivial = "from playwright.sync_api import sync_playwright\nprint('hi')\n"
    page = (
        "import os\nfrom playwright.sync_api import sync_playwright, expect\nwith sync_playwright() as p:\n"
        "    b = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'])\n    page = b.new_page()\n"
        f"    page.goto('{url}')\n    expect(page.get_by_role('heading')).to_have_text('Sign in to Acme')\n"
        "    b.close()\n"
    )
    started = time.perf_counter()
    problem = bubblewrap.bubblewrap_problem()
    print(f"bubblewrap probe: {(time.perf_counter() - started) * 1000:.0f} ms ({problem or 'ok'})")
    for name, source in (("trivial script", trivial), ("Chromium, goto, expect", page)):
        runs_of = (
            ("sandboxed", bubblewrap.run_sandboxed),
            ("watchdog only", _without_kernel_limits(bubblewrap.run_sandboxed)),
            ("unsandboxed", writer._run_unsandboxed),
        )
        for label, run in runs_of:
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                result = run(source, url=url, browser=browser, timeout_s=60, default_timeout_ms=5000)
                times.append(time.perf_counter() - t)
                if result.returncode != 0:
                    raise SystemExit(f"{name} failed {label}:\n{result.output}")
            print(f"{name:24} {label:14} median {statistics.median(times):.3f} s  "
                  f"min {min(times):.3f}  max {max(times):.3f}")  # fmt: skip
    server.shutdown()


def _without_kernel_limits(run):
    """`run` as on a machine where no cgroup can be made and no tmpfs sized in entries mounted."""

    def without(*args, **kwargs):
        with (
            mock.patch.object(bubblewrap.Cgroup, "make", return_value=None),
            mock.patch.object(bubblewrap, "can_size_entries", return_value=False),
        ):
            return run(*args, **kwargs)

    return without


if __name__ == "__main__":
    main()
