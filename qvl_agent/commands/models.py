"""`qvl-agent models`: the model profiles, with their published scores and where each fact comes from.

    qvl-agent models [--json]

One block per profile: the name `--profile` takes, the checkpoints, how it is asked (system prompt,
input order, reply format, refusal, pixel budget, token budget), whether it drives `run`/`browse` itself
or only grounds (then under `--planner`), ScreenSpot scores as reported and as reproduced, and sources.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from qvl_agent.config import Settings
from qvl_agent.profiles import DEFAULT, PROFILES, Profile


def register(sub) -> None:
    p = sub.add_parser("models", help="list the model profiles and their scores", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one JSON array of the profiles")
    p.set_defaults(func=run)


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def describe(profile: Profile) -> list[str]:
    order = "text, then image" if profile.text_first else "image, then text"
    refusal = {"": "none (it always guesses)", "[-1,-1]": "[-1,-1]", "terminate": "terminate with status failure"}
    lines = [
        f"{profile.name}  {profile.title}",
        f"  checkpoints: {', '.join(profile.hf_ids)}",
        f"  asks: {'system prompt ' + profile.system_prompt if profile.system_prompt else 'no system prompt'}; "
        f"{order}; reply {profile.reply_format} on a 0-{profile.scale} grid; "
        f"refusal {refusal[profile.refusal]}",
        f"  pixels {profile.min_pixels:,}-{profile.max_pixels:,}; greedy; up to {profile.max_new_tokens} new tokens",
        f"  agent: {profile.agent_note}",
    ]
    for s in profile.scores:
        note = f" ({s.note})" if s.note else ""
        lines.append(
            f"  {s.benchmark} {s.size}: reported {_score(s.reported)}, reproduced {_score(s.reproduced)}{note}"
        )
    lines.append(f"  zoom: {profile.zoom_note}")
    lines += [f"  source: {source}" for source in profile.sources]
    return lines


def run(args: argparse.Namespace, settings: Settings) -> int:
    ordered = [DEFAULT, *(p for p in PROFILES.values() if p is not DEFAULT)]  # the base model first
    if args.json:
        print(json.dumps([dataclasses.asdict(p) for p in ordered], indent=2), flush=True)
        return 0
    blocks = ["\n".join(describe(p)) for p in ordered]
    print("\n\n".join(blocks), flush=True)
    return 0
