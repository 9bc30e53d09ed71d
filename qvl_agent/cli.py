"""The `qvl-agent` command. Each subcommand lives in `qvl_agent/commands/<name>.py` and exposes
`register(subparsers)`, which adds its parser and sets `func(args, settings) -> int`.

Errors that qvl-agent raises on purpose reach the person as one sentence on stderr and an exit code
(0 ok, 1 task failed, 2 bad input or usage); nothing else prints a traceback unless --debug is given.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from qvl_agent import __version__, config
from qvl_agent.errors import QvlError, UsageError

# Subcommand modules, in the order `--help` lists them.
COMMANDS = [
    "ask",
    "locate",
    "run",
    "browse",
    "playwright",
    "replay",
    "trace",
    "tray",
    "serve",
    "mcp",
    "eval",
    "doctor",
    "bench",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 too; keep its one-line message
        self.print_usage(sys.stderr)
        self.exit(2, f"qvl-agent: {message}\n")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """--model and --engine, shared by every command that talks to a model."""
    parser.add_argument("--model", help="model id or local directory (default: Qwen/Qwen3-VL-2B-Instruct)")
    parser.add_argument("--engine", help="local (default), replay:FILE or openai:URL")
    parser.add_argument("--device", help=f"{config.DEVICES} (default: auto)")
    parser.add_argument("--api-key", help="key for --engine openai:URL (default: $QVL_API_KEY)")


def add_image_args(parser: argparse.ArgumentParser) -> None:
    """--image PATH or --screen (one of them is required) and --monitor N, shared by ask and locate."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", metavar="PATH", help="an image file (PNG, JPEG, WebP, ...)")
    source.add_argument("--screen", action="store_true", help="capture the screen now")
    parser.add_argument("--monitor", type=int, metavar="N", help="with --screen: monitor N (1 = first, 0 = all)")


def image_from_args(args: argparse.Namespace):
    """The screenshot that --image or --screen names. Callers read it before loading a model, so bad
    input fails in milliseconds."""
    from qvl_agent import capture, image

    if args.monitor is not None and not args.screen:
        raise UsageError("--monitor only applies with --screen.")
    return capture.grab(monitor=args.monitor) if args.screen else image.load_image(args.image)


def check_url(url: str) -> str:
    """The --url of a browser command, which must be a web page or a local file."""
    url = url.strip()
    if not url.startswith(("http://", "https://", "file://")):
        raise UsageError(f"--url must start with http://, https:// or file://, not {url!r}.")
    return url


def add_secret_args(parser: argparse.ArgumentParser) -> None:
    """--secret NAME, shared by run and browse."""
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a secret the model types as {{NAME}} without seeing it; its value comes from $QVL_SECRET_NAME "
        "(or a hidden prompt); repeatable",
    )


def secrets_from_args(args: argparse.Namespace):
    """The values of the run's --secret names (secrets.read_secrets), asking on a terminal when unset."""
    import getpass
    import os

    from qvl_agent.secrets import read_secrets

    ask = getpass.getpass if sys.stdin is not None and sys.stdin.isatty() else None
    return read_secrets(args.secret, os.environ, ask)


def task_and_steps(args: argparse.Namespace, example: str) -> str:
    """The task text, after the checks every agent command (run, browse) makes on it and on --max-steps."""
    task = " ".join(args.task).strip()
    if not task:
        raise UsageError(f"The task is empty: say what to do, e.g. {example}.")
    if args.max_steps < 1:
        raise UsageError(f"--max-steps must be at least 1, not {args.max_steps}.")
    return task


def print_event(event, prefix: str = "") -> None:
    """One line per action or refused action of an agent run, for the terminal (model text escaped);
    `prefix` marks every line, e.g. "DRY RUN: "."""
    from qvl_agent.act.guard import describe_pixels
    from qvl_agent.actions import printable

    if event.kind == "action" and event.action is not None:
        print(f"step {event.step}: {prefix}{describe_pixels(event.action, list(event.pixels))}", flush=True)
    elif event.kind == "error":
        print(f"step {event.step}: {prefix}not carried out: {printable(event.message)}", flush=True)


def print_result(result, trace_dir, prefix: str = "") -> None:
    """An agent run's answer on stdout and its status line on stderr, model text escaped for the terminal."""
    from qvl_agent.actions import printable

    if result.answer:
        print(printable(result.answer, keep="\n\t"), flush=True)
    line = f"{prefix}{result.status}: {printable(result.message)} (trace: {trace_dir})"
    print(f"qvl-agent: {line}", file=sys.stderr, flush=True)


def print_report(trace_dir) -> None:
    """Write a finished run's report.html and say where it is (a report that fails is a note, not an error)."""
    from qvl_agent.report import write_report

    try:
        print(f"qvl-agent: report: {write_report(trace_dir)}", file=sys.stderr, flush=True)
    except QvlError as exc:
        print(f"qvl-agent: note: no report was written: {exc}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qvl-agent",
        description="A local desktop agent on Qwen3-VL: ask about the screen, automate the desktop and the browser.",
    )
    parser.add_argument("--version", action="version", version=f"qvl-agent {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"qvl_agent.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"qvl_agent.commands.{name}":
                continue  # a command this build does not ship
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        loaded = config.load()
        for notice in loaded.notices:
            print(f"qvl-agent: {notice}", file=sys.stderr)
        settings = config.replace(
            loaded.settings,
            model=getattr(args, "model", None),
            engine=getattr(args, "engine", None),
            device=getattr(args, "device", None),
            api_key=getattr(args, "api_key", None),
        )
        return int(args.func(args, settings) or 0)
    except QvlError as exc:
        if args.debug:
            raise
        print(f"qvl-agent: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("qvl-agent: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
