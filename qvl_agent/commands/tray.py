"""`qvl-agent tray`: the tray icon with global hotkeys to ask about the screen.

    qvl-agent tray [--model ...] [--engine ...] [--device ...]
    qvl-agent tray --send ask|region|task|stop|takeover|settings|quit

The model loads once in the background; the icon's tooltip says when it is ready. Hotkeys (defaults
Ctrl+Alt+Q ask, Ctrl+Alt+R region, Ctrl+Alt+Esc stop) are recorded in Settings. One instance runs per user:
a second start says so and exits 1; `--send` drives the running one instead (a desktop shortcut can run
`qvl-agent tray --send ask`, `stop` or `takeover` where global hotkeys are not available, as under
Wayland). Notices (ready, still loading, a task's outcome) also go to stderr, one line each.
"""

from __future__ import annotations

import argparse
import sys

from qvl_agent import capture, config
from qvl_agent.cli import add_engine_args
from qvl_agent.config import Settings
from qvl_agent.errors import CaptureError, UsageError

SEND_COMMANDS = ("ask", "region", "task", "stop", "takeover", "settings", "quit")


def register(sub) -> None:
    p = sub.add_parser("tray", help="tray icon and hotkeys: ask about the screen", description=__doc__.splitlines()[0])
    add_engine_args(p)
    p.add_argument(
        "--send", choices=SEND_COMMANDS, metavar="COMMAND",
        help=f"send a command to the running tray app ({', '.join(SEND_COMMANDS)}) and exit",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    problem = capture.display_problem()
    if problem:
        raise CaptureError(problem)
    settings_path = config.config_path()
    if args.send:
        return _send(settings_path.parent, args.send)
    from qvl_agent.ui import app  # PySide6 only from here on

    return app.run(settings, settings_path, tuple(config.NOTICES))


def _send(config_dir, command: str) -> int:
    from qvl_agent.ui import instance  # PySide6 stays inside qvl_agent.ui

    reply = instance.send(config_dir, command)
    if reply is None:
        raise UsageError("The tray app is not running for this user: start it with `qvl-agent tray`.")
    if reply != "ok":
        print(f"qvl-agent: the tray app did not accept {command!r} ({reply or 'no reply'}).", file=sys.stderr)
        return 1
    return 0
