#!/usr/bin/env python3
"""Benchmark the resident engine against the plain transformers pipeline (same as `qvl-agent bench`).

usage: python scripts/bench_engine.py [--model DIR] [--device cpu|cuda] [--reps N] [--json FILE]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qvl_agent.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
