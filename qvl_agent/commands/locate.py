"""`qvl-agent locate`: where is something on an image or the screen, as one point in pixels.

    qvl-agent locate (--image FILE | --screen [--monitor N]) [--json] [--engine ...] DESCRIPTION

Prints `X Y` (pixels of the image, or of the virtual desktop for --screen), or with --json one object
{"x", "y", "model_x", "model_y", "ms"} (model_x/y on Qwen3-VL's 0-1000 grid, ms the model's time).
Exit 0 with a point, 1 when the model's answer names none, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json

from qvl_agent.cli import add_engine_args, add_image_args, image_from_args
from qvl_agent.config import Settings, replace
from qvl_agent.engine import open_engine
from qvl_agent.errors import ParseError, TaskFailed, UsageError
from qvl_agent.grounding import locate


def register(sub) -> None:
    p = sub.add_parser("locate", help="find something on an image or the screen", description=__doc__.splitlines()[0])
    add_engine_args(p)
    add_image_args(p)
    p.add_argument("--json", action="store_true", help='one JSON object: {"x", "y", "model_x", "model_y", "ms"}')
    p.add_argument("--max-pixels", type=int, metavar="N", help="cap on the pixels the model sees")
    p.add_argument("description", nargs="+", metavar="DESCRIPTION", help='what to find, e.g. "the Save button"')
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    description = " ".join(args.description).strip()
    if not description:
        raise UsageError('Say what to find, e.g. qvl-agent locate --screen "the Save button".')
    settings = replace(settings, max_pixels=args.max_pixels)
    shot = image_from_args(args)
    with open_engine(settings) as engine:
        try:
            point = locate(engine, shot, description)
        except ParseError as exc:
            raise TaskFailed(str(exc)) from None  # the reply named no point: exit 1
    if args.json:
        out = {"x": point.x, "y": point.y, "model_x": point.model_x, "model_y": point.model_y, "ms": round(point.ms, 1)}
        print(json.dumps(out), flush=True)
    else:
        print(f"{point.x} {point.y}", flush=True)
    return 0
