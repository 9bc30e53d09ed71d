"""`qvl-agent bench`: time the resident engine against plain transformers on this machine."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark the engine against plain transformers",
        description=__doc__.splitlines()[0],
        epilog="The engine runs with the settings of the QVL_* variables (QVL_FAST_PREFILL=1 times a path that "
        "is off by default), never those of the settings file.",
    )
    p.add_argument(
        "--model",
        metavar="MODEL",
        help="model directory or id (default: random weights in the real 2B shape on a GPU, the tiny shape on a CPU)",
    )
    p.add_argument(
        "--shape",
        choices=("tiny", "tiny-4b", "tiny-8b", "2b"),
        metavar="SHAPE",
        help="random weights of this shape when no --model: tiny, tiny-4b, tiny-8b (tiny models with what sets "
        "the 4B and 8B apart) or 2b (default: 2b on a GPU, tiny on a CPU)",
    )
    p.add_argument("--device", default="auto", metavar="DEVICE", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--reps", type=int, default=5, metavar="N", help="runs per scenario; medians are reported")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument(
        "--start-times",
        action="store_true",
        help="first time start to ready in two fresh processes, compile cache cold then warm (minutes on a GPU)",
    )
    p.set_defaults(func=run)


def run(args, settings) -> int:
    from qvl_agent.devtools import bench

    report = bench.run(
        args.model,
        args.device,
        max(1, args.reps),
        log=lambda m: print(m, file=sys.stderr),
        shape=args.shape,
        start_times=args.start_times,
    )
    print(bench.format_table(report))
    bench.main_json(report, args.json)
    return 0
