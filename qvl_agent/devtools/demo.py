"""What `scripts/demo` showed, in plain words, from the `qvl-agent ask --stats` lines of its two-question
conversation (one JSON object per turn):

    python -m qvl_agent.devtools.demo STATS_FILE [--random-weights]

A development tool: it reads numbers the CLI printed and explains them; it runs no model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qvl_agent.config import DEFAULT_MODEL, download_command


def read_stats(text: str) -> list[dict]:
    """The per-turn stats objects among other stderr lines."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def report(stats: list[dict], random_weights: bool) -> str:
    """A few sentences on what the demo's conversation showed; `stats` holds the two turns' stats."""
    if len(stats) < 2:
        return "The demo did not finish both questions, so there is nothing to compare (see the errors above)."
    first, follow = stats[0], stats[1]
    lines = []
    if random_weights:
        lines.append(
            "The model had random weights (a tiny Qwen3-VL built here, because real weights were not given), "
            "so the answers above are noise: this run shows the speed and the reuse, not understanding."
        )
    lines.append(
        f"Question 1: the vision tower encoded the 1920x1080 screenshot ({first['vision_ms']:.0f} ms) and "
        f"{first['prefill_tokens']} tokens were prefilled; the first token came after {first['ttft_ms']:.0f} ms."
    )
    if follow["vision"] == "hit":
        lines.append(
            f"Question 2, the follow-up, reused the screenshot's vision features and the conversation's KV cache: "
            f"it prefilled {follow['prefill_tokens']} of {follow['prompt_tokens']} tokens; the first token came "
            f"after {follow['ttft_ms']:.0f} ms."
        )
    else:
        lines.append(
            f"Question 2 did NOT reuse the screenshot's features (vision: {follow['vision']}); it prefilled "
            f"{follow['prefill_tokens']} of {follow['prompt_tokens']} tokens."
        )
    lines.append(f"First token: {first['ttft_ms']:.0f} ms -> {follow['ttft_ms']:.0f} ms.")
    if random_weights:
        lines.append(
            f"With real weights: {download_command(DEFAULT_MODEL)}, then MODEL=DIR scripts/demo "
            "(an NVIDIA GPU makes it sub-second)."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stats_file", type=Path)
    parser.add_argument("--random-weights", action="store_true", help="the model was the tiny random one")
    args = parser.parse_args(argv)
    print(report(read_stats(args.stats_file.read_text(encoding="utf-8")), args.random_weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
