#!/usr/bin/env python3
"""Where the engine's time goes, per phase (vision tower, prefill, decode, verify): GPU kernel time, the
gaps between kernels, host time per token and the top kernels. See qvl_agent/devtools/profile.py.

usage: python scripts/profile_engine.py [--model DIR] [--device auto|cuda|cpu] [--tokens N] [--screen WxH] [--json FILE]
(without --model: random weights in the real 2B shape on a GPU, the tiny shape on a CPU)
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qvl_agent.devtools.profile import format_report, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", metavar="DIR", help="model folder (default: random weights)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu (default: %(default)s)")
    parser.add_argument("--tokens", metavar="N", type=int, default=128, help="decoded tokens (default: %(default)s)")
    parser.add_argument("--screen", metavar="WxH", default="1920x1080", help="screenshot size (default: %(default)s)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON here")
    args = parser.parse_args()
    if not 2 <= args.tokens <= 4096:
        parser.error("--tokens must be between 2 and 4096")
    try:
        screen = tuple(int(v) for v in args.screen.lower().split("x"))
    except ValueError:
        screen = ()
    if len(screen) != 2 or not all(64 <= v <= 8192 for v in screen):
        parser.error("--screen must be WIDTHxHEIGHT, each between 64 and 8192")
    report = run(args.model, args.device, args.tokens, screen, log=lambda m: print(m, file=sys.stderr))
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
