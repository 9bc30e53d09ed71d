"""`qvl-agent replay`: run a saved Playwright script inside the sandbox.

    qvl-agent replay [--allow-domain HOST]... [--allow-file PATH]... [--url URL] [-o DIR] [--browser PATH]
                     [--timeout SECONDS] [--step-timeout SECONDS] [--heal [--engine SPEC] [--trace-dir DIR]] SCRIPT.py

The script (exported by `browse --export`, or written by `qvl-agent playwright`) runs in the same
bubblewrap sandbox as `playwright --verify` (`playwright.replay`): network only to the origins its first
lines name (`# qvl-agent-origins:`), plus each --allow-domain HOST and the origin of --url (passed on to
the script as `--url URL`, as exported scripts take it); host files only each --allow-file PATH (a local
page the header names must be given so), read-only. Before it starts, what the script is given (network,
host files, secret variables) is printed. The files it writes go to a new folder (-o DIR,
which must not exist, else the first free of SCRIPT.out, SCRIPT.out-2, ...), never over an existing file
and never a hidden, runnable or instruction file. Its output is shown; the exit status is the script's own
(124 when the timeout ended it, 1 when a sandbox limit did), 2 on bad usage or no sandbox.

With --heal, a step whose locator broke (nothing found, two found, a click something else intercepts, a
failed check on an element that is gone) is repaired by the model from a screenshot and the step's
intent (`scripts.heal.replay`); every heal is listed, the run's report shows each one, and a replay
that reached its end writes SCRIPT.healed.py (its diff printed), which replays without the model. A heal
the model is unsure of stops the replay with one sentence (exit 1).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from qvl_agent.actions import printable
from qvl_agent.cli import add_engine_args
from qvl_agent.config import Settings
from qvl_agent.errors import UsageError

TIMED_OUT = 124  # the exit status of timeout(1)


def register(sub) -> None:
    p = sub.add_parser(
        "replay", help="run a saved Playwright script in the sandbox", description=__doc__.splitlines()[0]
    )
    p.add_argument("script", metavar="SCRIPT", help="the script to run (a .py file)")
    p.add_argument(
        "-o", "--output", metavar="DIR", help="a new folder for the files it writes (default: SCRIPT.out beside it)"
    )
    p.add_argument(
        "--allow-domain", action="append", default=[], metavar="HOST",
        help="let the script reach HOST too (http and https; or give an origin like https://host:8443); repeatable",
    )  # fmt: skip
    p.add_argument(
        "--allow-file", action="append", default=[], metavar="PATH",
        help="let the script read this host file (read-only), e.g. the local page its header names; repeatable",
    )  # fmt: skip
    p.add_argument("--url", metavar="URL", help="start URL passed to the script as --url (its origin is allowed)")
    p.add_argument("--browser", metavar="PATH", help="Chromium (default: $QVL_BROWSER, or find one)")
    p.add_argument("--timeout", type=float, default=600, metavar="SECONDS", help="end the run after this")
    p.add_argument(
        "--step-timeout", type=float, metavar="SECONDS",
        help="how long each step of a script qvl-agent exported waits for its element (passed to it as --timeout; "
        "default: the script's own, 30); with --heal, also the longest a broken step is probed (5 s at most)",
    )  # fmt: skip
    p.add_argument(
        "--heal", action="store_true",
        help="when a step's locator breaks, ask the model where its element is now, go on, and write SCRIPT.healed.py",
    )  # fmt: skip
    p.add_argument("--trace-dir", metavar="DIR", help="with --heal: the run folder for the heals' report")
    add_engine_args(p)
    p.set_defaults(func=replay_command)


def replay_command(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.playwright.chromium import find_browser
    from qvl_agent.scripts.header import BadOrigin
    from qvl_agent.scripts.replay import replay_script

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script} is not a script file.")
    if not 0 < args.timeout <= 86_400:
        raise UsageError(f"--timeout must be from 0 to 86400 seconds, not {args.timeout:g}.")
    if args.step_timeout is not None and not 0 < args.step_timeout <= 86_400:
        raise UsageError(f"--step-timeout must be from 0 to 86400 seconds, not {args.step_timeout:g}.")
    output = Path(args.output) if args.output else None
    if output is not None and (output.exists() or output.is_symlink()):
        raise UsageError(f"{output} already exists: give -o a folder that does not exist yet.")
    if output is not None and not output.parent.resolve().is_dir():
        raise UsageError(f"Cannot make {output}: the folder {output.parent} does not exist.")
    if args.trace_dir and not args.heal:
        raise UsageError("--trace-dir only goes with --heal.")
    browser = find_browser(args.browser, settings.browser, headless=True)  # the sandbox shows no window
    healing = None
    try:
        if args.heal:
            healing = _heal(args, settings, script, browser, output)
            result = healing.replay
        else:
            result = replay_script(
                script, browser=browser, timeout_s=args.timeout, output=output, allow=args.allow_domain, url=args.url,
                memory_mb=settings.sandbox_memory_mb, secrets=os.environ, allow_files=args.allow_file,
                before_start=_print_grant, step_timeout_s=args.step_timeout,
            )  # fmt: skip
    except BadOrigin as exc:
        raise UsageError(str(exc)) from None
    except FileExistsError:
        raise UsageError(f"{output} already exists: give -o a folder that does not exist yet.") from None
    except UnicodeDecodeError:
        raise UsageError(f"{args.script} is not a UTF-8 text file.") from None
    except OSError as exc:
        raise UsageError(f"Cannot read {args.script}: {exc.strerror or exc}.") from None
    if not result.header and not args.allow_domain and not args.url:
        print(
            "qvl-agent: this script names no origins (no `# qvl-agent-origins:` line), so it runs without network: "
            "add --allow-domain HOST for each site it needs.",
            file=sys.stderr,
        )
    sys.stdout.write(printable(result.output, keep="\n\t"))  # its own output, escaped: it drives no terminal
    sys.stdout.flush()
    for path in result.written:
        print(f"qvl-agent: kept {printable(str(path))}", file=sys.stderr)
    for name in result.refused:
        print(
            f"qvl-agent: not kept {printable(name)}: only documents, data and media files are copied, into a new "
            "folder, never a hidden, runnable or instruction file",
            file=sys.stderr,
        )
    if healing is not None:
        _print_heals(healing)
        if healing.stopped:
            return 1
    if result.limit:
        print(f"qvl-agent: the sandbox stopped the script because {result.limit}.", file=sys.stderr)
        return 1
    if result.returncode is None:
        print(f"qvl-agent: the script did not finish within {args.timeout:g} seconds.", file=sys.stderr)
        return TIMED_OUT
    return result.returncode if 0 <= result.returncode < 256 else 1


def _print_grant(grant) -> None:
    """What the script is about to be given, before it runs: the person sees it whatever the script does."""
    for line in grant.lines():
        print(f"qvl-agent: {printable(line)}", file=sys.stderr)
    sys.stderr.flush()


def _heal(args: argparse.Namespace, settings: Settings, script: Path, browser: str, output: Path | None):
    from qvl_agent.cli import notify
    from qvl_agent.engine import open_engine
    from qvl_agent.grounding import Zoom, point_or_click
    from qvl_agent.scripts.heal.replay import heal_replay
    from qvl_agent.trace import default_trace_dir

    trace_dir = Path(args.trace_dir) if args.trace_dir else default_trace_dir()
    with open_engine(settings, notify=notify) as engine:
        ground = functools.partial(point_or_click, engine, zoom=Zoom.from_settings(settings))
        return heal_replay(
            script, ground, engine_name=engine.name, trace_dir=trace_dir,
            browser=browser, timeout_s=args.timeout, output=output, allow=args.allow_domain, url=args.url,
            memory_mb=settings.sandbox_memory_mb, secrets=os.environ, allow_files=args.allow_file,
            before_start=_print_grant, step_timeout_s=args.step_timeout,
        )  # fmt: skip


def _print_heals(healing) -> None:
    """Every heal, in order (nothing is healed silently); the healed script and its diff; the report."""
    from qvl_agent.cli import print_report
    from qvl_agent.scripts.heal.replay import failing_code, new_code

    source = healing.source
    for heal in healing.heals:
        if heal.problem:
            continue  # the sentence it stopped with follows
        where = f"step {heal.step}" if heal.step is not None else f"line {heal.where.get('line', '?')}"
        old, new = printable(failing_code(source, heal)), printable(new_code(heal))
        if heal.reused:
            print(
                f"qvl-agent: healed {where} again at line {heal.where.get('line', '?')}: {old} -> {new}",
                file=sys.stderr,
            )
        elif heal.kind == "cover":
            print(
                f"qvl-agent: healed {where}: something covered the page; {new} now dismisses it "
                f"({heal.total_ms / 1000:.2f} s, the model {heal.model_ms / 1000:.2f} s)",
                file=sys.stderr,
            )
        else:
            print(
                f"qvl-agent: healed {where} ({printable(heal.description)}): {old} -> {new} "
                f"({heal.total_ms / 1000:.2f} s, the model {heal.model_ms / 1000:.2f} s)",
                file=sys.stderr,
            )
    if healing.stopped:
        print(f"qvl-agent: {printable(healing.stopped)}", file=sys.stderr)
    if healing.healed_path is not None:
        print(
            f"qvl-agent: wrote {printable(str(healing.healed_path))}, which replays without the model; its changes:",
            file=sys.stderr,
        )
        sys.stdout.write(printable(healing.diff, keep="\n\t"))
        sys.stdout.flush()
    elif healing.not_written:
        why = printable(healing.not_written.rstrip("."))
        print(f"qvl-agent: no healed script was written: {why}.", file=sys.stderr)
    elif not healing.heals and healing.ok:
        print("qvl-agent: no step needed healing.", file=sys.stderr)
    if healing.trace_dir is not None:
        print_report(healing.trace_dir)
