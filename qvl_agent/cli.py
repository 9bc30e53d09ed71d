"""The `qvl-agent` command. Each subcommand lives in `qvl_agent/commands/<name>.py` and exposes
`register(subparsers)`, which adds its parser and sets `func(args, settings) -> int`.

Errors that qvl-agent raises on purpose reach the person as one sentence on stderr and an exit code
(0 ok, 1 task failed, 2 bad input or usage); nothing else prints a traceback unless --debug is given.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Iterator

from qvl_agent import __version__, config
from qvl_agent.errors import QvlError, UsageError

# Subcommand modules, in the order `--help` lists them.
COMMANDS = [
    "ask",
    "locate",
    "run",
    "browse",
    "record",
    "playwright",
    "replay",
    "trace",
    "tray",
    "serve",
    "mcp",
    "eval",
    "doctor",
    "bench",
    "warm_up",
    "models",
]


class _HelpFormatter(argparse.HelpFormatter):
    """Every option that has a default shows it, as "(default: X)", the same way in every subcommand."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not _has_default(action):
            return text
        return f"{text} (default: %(default)s)"


def _has_default(action: argparse.Action) -> bool:
    """Whether `action` has a default worth showing: flags (on/off) and empty or unset defaults have none."""
    if not action.option_strings or action.nargs == 0:
        return False
    return action.default is not None and action.default is not argparse.SUPPRESS and action.default != []


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse exits 2 too; keep its one-line message
        from qvl_agent.actions import printable

        self.print_usage(sys.stderr)
        self.exit(2, f"qvl-agent: {printable(message)}\n")

    def parse_args(self, args=None, namespace=None):
        # A flag that no parser knows is reported by the parser of the (sub)command it was given to, with the
        # closest option of that command.
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chain = list(_chosen_parsers(self, parsed))
            known = [opt for p in chain for a in p._actions for opt in a.option_strings]
            word = extras[0].split("=", 1)[0]
            close = difflib.get_close_matches(word, known, n=1) if word.startswith("-") else []
            owner = next((p for p in chain if close and close[0] in p._option_string_actions), chain[-1])
            hint = f": did you mean {close[0]}?" if close else f" (see {owner.prog} --help)."
            owner.error(f"unrecognized argument {extras[0]}{hint}")
        return parsed

    def _check_value(self, action: argparse.Action, value) -> None:
        # A mistyped subcommand or choice names the closest one instead of listing them all.
        if action.choices is not None and value not in action.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in action.choices], n=1)
            if close and isinstance(action, argparse._SubParsersAction):
                raise argparse.ArgumentError(None, f"unknown command {value!r}: did you mean {close[0]!r}?")
            if close:
                raise argparse.ArgumentError(action, f"invalid choice {value!r}: did you mean {close[0]!r}?")
        super()._check_value(action, value)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _chosen_parsers(parser: argparse.ArgumentParser, parsed: argparse.Namespace):
    """The parser, then the parser of each (sub)command that `parsed` chose, outermost first."""
    while parser is not None:
        yield parser
        sub = _subparsers(parser)
        chosen = getattr(parsed, sub.dest, None) if sub is not None else None
        parser = sub.choices.get(chosen) if chosen is not None else None


def walk_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator:
    """(path, parser) for `parser` and every subcommand's parser below it, e.g. (("trace", "list"), p)."""
    yield path, parser
    sub = _subparsers(parser)
    if sub is not None:
        for name, child in sub.choices.items():
            yield from walk_parsers(child, (*path, name))


def _name_values(parser: argparse.ArgumentParser) -> None:
    """Options that take a value and were given no metavar get one in capitals: N for a number, else the
    option's name (argparse would show `--port PORT` but `data` for a positional, and nothing for choices)."""
    for _, p in walk_parsers(parser):
        for action in p._actions:
            if action.nargs == 0 or action.metavar is not None or isinstance(action, argparse._SubParsersAction):
                continue
            action.metavar = "N" if action.type in (int, float) else action.dest.upper()


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """--model and --engine, shared by every command that talks to a model."""
    parser.add_argument(
        "--model",
        metavar="MODEL",
        help=f"model id or local directory (default: the model setting, {config.DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--engine", metavar="ENGINE", help="local, replay:FILE or openai:URL (default: the engine setting, local)"
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="how the model is asked and read: qwen3-vl, ui-venus-1.5, mai-ui or gui-owl-1.5 "
        "(default: chosen from the model's own files; see qvl-agent models)",
    )
    parser.add_argument("--device", metavar="DEVICE", help=f"{config.DEVICES} (default: the device setting, auto)")
    parser.add_argument("--api-key", metavar="KEY", help="key for --engine openai:URL (default: $QVL_API_KEY)")


def notify(line: str) -> None:
    """A line for the person on stderr, e.g. which model profile `open_engine` chose."""
    print(f"qvl-agent: {line}", file=sys.stderr, flush=True)


def add_image_args(parser: argparse.ArgumentParser) -> None:
    """--image PATH or --screen (one of them is required) and --monitor N, shared by ask and locate."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", metavar="FILE", help="an image file (PNG, JPEG, WebP, ...)")
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


REASON_CHARS = 160  # a reason longer than this is cut on the terminal; the trace keeps all of it


def one_line_reason(reply: str) -> str:
    """The first line of what the model said besides its tool calls, cut to REASON_CHARS ("" for none)."""
    from qvl_agent.parse import reply_words

    words = reply_words(reply)
    line = words.splitlines()[0].strip() if words else ""
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def print_event(event, prefix: str = "", reasons: bool = False) -> None:
    """One line per action or refused action of an agent run, for the terminal (model text escaped);
    `prefix` marks every line, e.g. "DRY RUN: "; `reasons` adds a line with the model's reason for each
    step, as it said it before its actions."""
    from qvl_agent.act.guard import describe_pixels
    from qvl_agent.actions import printable

    if reasons and event.kind == "reply" and (reason := one_line_reason(event.message)):
        print(f"step {event.step}: {prefix}the model says: {printable(reason)}", flush=True)
    elif event.kind == "action" and event.action is not None:
        print(f"step {event.step}: {prefix}{describe_pixels(event.action, list(event.pixels))}", flush=True)
    elif event.kind == "error":
        print(f"step {event.step}: {prefix}not carried out: {printable(event.message)}", flush=True)
    elif event.kind == "dialog":
        print(f"step {event.step}: {prefix}{printable(event.message)}", flush=True)


def start_takeover(settings, switch, person=None, *, where: str = "the screen", banner: bool = True):
    """The take-over of a run (`takeover.TakeOver`) listening to `takeover_hotkey`, announced on the
    terminal; its pauses shown by a terminal line and the banner window (`ui.banner`). With no global
    hotkeys here it still serves the model's call_user (the banner's button hands back). Where the person's
    recorder takes marks (the desktop's), the banner has a box to keep what they type private."""
    from qvl_agent.config import hotkey_label
    from qvl_agent.takeover import TakeOver
    from qvl_agent.ui.banner import PauseNotice

    label = hotkey_label(settings.hotkeys.takeover)
    takeover = TakeOver(switch, person, hotkey=label, where=where)
    problem = takeover.listen(settings.hotkeys.takeover)
    private = takeover.mark_private if hasattr(person, "mark_private") else None
    takeover.show = PauseNotice("" if problem else label, takeover.hand_back, banner=banner, on_private=private,
                                on_window=takeover.keep_out)  # fmt: skip
    if problem:
        print(f"qvl-agent: note: the take-over hotkey is not available: {problem}.", file=sys.stderr, flush=True)
    else:
        print(f"qvl-agent: {label} takes over; press it again to hand back.", file=sys.stderr, flush=True)
    return takeover


def print_result(result, trace_dir, prefix: str = "") -> None:
    """An agent run's answer on stdout and its status line on stderr, model text escaped for the terminal."""
    from qvl_agent.actions import printable

    if result.answer:
        print(printable(result.answer, keep="\n\t"), flush=True)
    line = f"{prefix}{printable(result.headline)} (trace: {trace_dir})"
    print(f"qvl-agent: {line}", file=sys.stderr, flush=True)
    if result.dry_run:
        print(printable(result.would_do_text(), keep="\n"), file=sys.stderr, flush=True)


DRY_RUN_EXIT = 3  # a dry run finished: nothing was done, so neither 0 (done) nor 1 (failed)


def run_exit_code(result) -> int:
    """0 when the task was done, 3 when a dry run finished (nothing was done), 130 when Ctrl+C interrupted
    it (as the shell would say), else 1."""
    if result.status == "dry_run":
        return DRY_RUN_EXIT
    return 0 if result.ok else 130 if result.status == "interrupted" else 1


def end_run_early(trace, exc: BaseException, **run_info) -> None:
    """Record how a run ended that never reached (or never left) the step loop, and write its report:
    Ctrl+C is "interrupted", anything else "failed to start", with the error's sentence."""
    from qvl_agent.agent import FAILED_TO_START

    if isinstance(exc, KeyboardInterrupt):
        trace.end_early("interrupted", "Interrupted (Ctrl+C) before the first step.", **run_info)
    else:
        trace.end_early(FAILED_TO_START, str(exc), **run_info)
    trace.close()
    print_report(trace.dir)


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
    _name_values(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    from qvl_agent.actions import printable

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
            profile=getattr(args, "profile", None),
            device=getattr(args, "device", None),
            api_key=getattr(args, "api_key", None),
        )
        return int(args.func(args, settings) or 0)
    except QvlError as exc:
        if args.debug:
            raise
        # Messages quote what the person or a data file gave: nothing in them may drive the terminal.
        print(f"qvl-agent: {printable(str(exc), keep=chr(10))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("qvl-agent: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
