"""`qvl-agent eval`: accuracy and speed on the standard benchmarks, with any engine.

    qvl-agent eval screenspot DATA [--limit N] [--zoom] [--out DIR] [--profile NAME] [--engine ...]
    qvl-agent eval miniwob [--tasks a,b,...] [--episodes N] [--seed S] [--out DIR] [--engine ...]

`screenspot` asks `locate` for every item of a ScreenSpot, ScreenSpot-v2 or ScreenSpot-Pro data set (a
file or a folder) and counts a hit when the point is inside the element's box. `miniwob` runs
MiniWoB++ tasks (the pages of the `miniwob` package, served on 127.0.0.1) through the browser loop.
Both print what they measured and write results.jsonl and report.html into --out (default: a new
folder under the user's data folder). Exit 0 when the evaluation ran, 2 on bad usage or data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qvl_agent.cli import add_engine_args, notify
from qvl_agent.config import Settings, replace
from qvl_agent.engine import open_engine
from qvl_agent.errors import UsageError
from qvl_agent.eval.report import run_facts


def register(sub) -> None:
    p = sub.add_parser("eval", help="measure accuracy on ScreenSpot or MiniWoB++", description=__doc__.splitlines()[0])
    which = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True, parser_class=type(p))

    s = which.add_parser(
        "screenspot",
        help="GUI grounding accuracy on a ScreenSpot-format data set",
        description="Ask the model to locate every item of a ScreenSpot, ScreenSpot-v2 or ScreenSpot-Pro data set "
        "and count a hit when its point is inside the element's box.",
    )
    s.add_argument("data", metavar="DATA", help="a .json/.jsonl data file, or a folder of them")
    s.add_argument("--limit", type=int, metavar="N", help="only the first N items")
    s.add_argument("--out", metavar="DIR", help="where results.jsonl and report.html go")
    s.add_argument("--max-pixels", type=int, metavar="N", help="cap on the pixels the model sees")
    s.add_argument(
        "--zoom",
        action="store_true",
        help="also ask on a crop around each first answer (when the zoom setting says so, always if it is off) "
        "and report accuracy with and without zoom side by side",
    )
    s.add_argument(
        "--zoom-crop",
        type=int,
        metavar="N",
        help="the crop, in percent of each side (default: the zoom_crop setting, 50)",
    )
    add_engine_args(s)
    s.set_defaults(func=screenspot)

    m = which.add_parser(
        "miniwob",
        help="MiniWoB++ task success through the browser loop",
        description="Run MiniWoB++ tasks (served on 127.0.0.1 from the miniwob package) through the browser "
        "loop and count the episodes the page rewards.",
    )
    m.add_argument("--tasks", metavar="A,B,...", help="task names, comma-separated (default: all)")
    m.add_argument("--episodes", type=int, default=5, metavar="N", help="episodes per task")
    m.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the first episode")
    m.add_argument("--out", metavar="DIR", help="where results.jsonl and report.html go")
    m.add_argument("--browser", metavar="FILE", help="Chromium (default: $QVL_BROWSER, or find one)")
    add_engine_args(m)
    m.set_defaults(func=miniwob)


def _out_dir(value: str | None, name: str) -> Path:
    from qvl_agent.eval.report import default_out_dir

    out = Path(value) if value else default_out_dir(name)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot create the folder {out}: {exc.strerror or exc}.") from None
    return out


def screenspot(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.eval import screenspot as ss

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}.")
    from qvl_agent.grounding import Zoom

    settings = replace(settings, max_pixels=args.max_pixels, zoom_crop=args.zoom_crop)
    zoom = Zoom.from_settings(settings, None if settings.zoom != "off" else "always") if args.zoom else None
    items = ss.load_dataset(args.data)[: args.limit]  # bad data fails before a model loads
    out = _out_dir(args.out, "screenspot")
    with open_engine(settings, notify=notify) as engine:
        outcomes = ss.evaluate(engine, items, out, zoom=zoom)
        facts = run_facts(settings, engine)
    lines = ss.summarize(outcomes)
    report = ss.write_screenspot_report(out, outcomes, lines, facts=facts)
    print("\n".join(lines), flush=True)
    print(f"qvl-agent: wrote {out / 'results.jsonl'} and {report}", file=sys.stderr, flush=True)
    return 0


def miniwob(args: argparse.Namespace, settings: Settings) -> int:
    from qvl_agent.eval import miniwob as mw

    if args.episodes < 1:
        raise UsageError(f"--episodes must be at least 1, not {args.episodes}.")
    from qvl_agent.playwright.chromium import find_browser

    tasks = mw.pick_tasks(args.tasks, mw.task_pages())
    find_browser(args.browser, settings.browser)  # no Chromium fails now, not once per episode
    out = _out_dir(args.out, "miniwob")
    with open_engine(settings) as engine:
        episodes = mw.evaluate(engine, tasks, args.episodes, args.seed, out, args.browser, settings.browser)
        facts = run_facts(settings, engine)
    lines, rows = mw.summarize(episodes)
    report = mw.write_miniwob_report(out, episodes, lines, rows, facts)
    print("\n".join(lines), flush=True)
    print(f"qvl-agent: wrote {out / 'results.jsonl'} and {report}", file=sys.stderr, flush=True)
    return 0
