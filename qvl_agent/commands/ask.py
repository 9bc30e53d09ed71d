"""`qvl-agent ask`: questions about one image or the screen, answered as one conversation.

Each answer streams to stdout as it is generated; follow-up questions reuse the image's vision
features and the conversation's KV cache. `--stats` writes one JSON object per turn to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from qvl_agent.actions import printable
from qvl_agent.cli import add_engine_args, add_image_args, image_from_args
from qvl_agent.config import Settings, replace
from qvl_agent.engine import STATS_KEYS, GenerationOptions, open_engine
from qvl_agent.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("ask", help="ask about an image or the screen", description=__doc__.splitlines()[0])
    add_engine_args(p)
    add_image_args(p)
    p.add_argument("--stats", action="store_true", help="one JSON object per turn on stderr")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="longest answer, in tokens")
    p.add_argument("--max-pixels", type=int, metavar="N", help="cap on the pixels the model sees")
    p.add_argument("question", nargs="+", metavar="QUESTION", help="one or more questions, asked in order")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    questions = [q.strip() for q in args.question]
    if not all(questions):
        raise UsageError('A question is empty: ask something, e.g. qvl-agent ask --image shot.png "What is this?"')
    settings = replace(settings, max_new_tokens=args.max_new_tokens, max_pixels=args.max_pixels)
    shot = image_from_args(args)
    options = GenerationOptions(max_new_tokens=settings.max_new_tokens)
    with open_engine(settings) as engine:
        if args.screen:  # a capture is encoded with the prompt before the question at once, where it can
            session = engine.open_session()
            session.prefetch([shot])
        else:
            session = engine.open_session([shot])
        for question in questions:
            for piece in session.ask(question, options=options):
                sys.stdout.write(printable(piece, keep="\n\t"))  # model text never drives the terminal
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
            if args.stats and session.last_stats:
                stats = session.last_stats.as_dict()
                ordered = {k: stats[k] for k in STATS_KEYS} | {k: v for k, v in stats.items() if k not in STATS_KEYS}
                print(json.dumps(ordered), file=sys.stderr, flush=True)
    return 0
