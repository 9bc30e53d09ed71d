#!/usr/bin/env python3
"""Build a tiny randomly initialised Qwen3-VL in DIR (a few MB, seconds): the real
Qwen3VLForConditionalGeneration, a processor with a locally trained tokenizer carrying Qwen's special
tokens, and a Qwen3-VL-style chat template. Load it like real weights: `qvl-agent ask --model DIR ...`.

usage: python scripts/make_tiny_model.py DIR [--seed N]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qvl_agent.devtools.tiny_model import save_random_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = save_random_model(args.dir, "tiny", seed=args.seed)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    print(f"tiny Qwen3-VL saved to {path} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
