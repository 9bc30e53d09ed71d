"""`qvl-agent locate`: where is something on an image or the screen, as one point in pixels.

    qvl-agent locate (--image FILE | --screen [--monitor N]) [--zoom [--zoom-crop N]] [--json]
                     [--profile NAME] [--engine ...] DESCRIPTION

Prints `X Y` (pixels of the image, or of the virtual desktop for --screen), or with --json one object
{"x", "y", "model_x", "model_y", "ms"} (model_x/y on the model's 0-1000 grid of the whole image, ms the
model's time; with a zoom-in pass also "passes": 2 and "first", the first pass's grid point).
The model is asked the way its profile says (`qvl-agent models`). --zoom asks a second time on a crop
around the first answer (the zoom setting does the same for large screens or unsure answers).
Exit 0 with a point, 1 when the model's answer names none or says it is not there, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json

from qvl_agent.cli import add_engine_args, add_image_args, image_from_args, notify
from qvl_agent.config import Settings, replace
from qvl_agent.engine import open_engine
from qvl_agent.errors import NotOnScreen, ParseError, TaskFailed, UsageError
from qvl_agent.grounding import Zoom, locate


def register(sub) -> None:
    p = sub.add_parser("locate", help="find something on an image or the screen", description=__doc__.splitlines()[0])
    add_engine_args(p)
    add_image_args(p)
    p.add_argument("--json", action="store_true", help='one JSON object: {"x", "y", "model_x", "model_y", "ms"}')
    p.add_argument("--max-pixels", type=int, metavar="N", help="cap on the pixels the model sees")
    p.add_argument("--zoom", action="store_true", help="ask again on a crop around the first answer")
    p.add_argument(
        "--zoom-crop",
        type=int,
        metavar="N",
        help="the crop, in percent of each side (default: the zoom_crop setting, 50)",
    )
    p.add_argument("description", nargs="+", metavar="DESCRIPTION", help='what to find, e.g. "the Save button"')
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    description = " ".join(args.description).strip()
    if not description:
        raise UsageError('Say what to find, e.g. qvl-agent locate --screen "the Save button".')
    settings = replace(settings, max_pixels=args.max_pixels, zoom_crop=args.zoom_crop)
    zoom = Zoom.from_settings(settings, "always" if args.zoom else None)
    shot = image_from_args(args)
    with open_engine(settings, notify=notify) as engine:
        try:
            point = locate(engine, shot, description, zoom=zoom)
        except NotOnScreen:
            raise TaskFailed(f"The model ({engine.profile.title}) says {description!r} is not on the screen.") from None
        except ParseError as exc:
            raise TaskFailed(str(exc)) from None  # the reply named no point: exit 1
    if args.json:
        out = {"x": point.x, "y": point.y, "model_x": point.model_x, "model_y": point.model_y, "ms": round(point.ms, 1)}
        if point.first is not None:
            out |= {"passes": point.passes, "first": list(point.first)}
        print(json.dumps(out), flush=True)
    else:
        print(f"{point.x} {point.y}", flush=True)
    return 0
