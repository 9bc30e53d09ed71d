"""`qvl-agent warm-up`: compile the decode step once for this GPU and torch, so that later starts load it.

    qvl-agent warm-up [--model ...] [--device ...]

Loads the local engine with compilation on, waits for the compiled decode step (minutes cold) and writes
torch's compile cache to a folder of this GPU model and torch build (docs/engine.md says where); every
later start of `serve`, `ask`, `tray`, ... with the same model, GPU and torch compiles from it in seconds.
Without a CUDA GPU there is nothing to compile: it says so and exits 0. Exit 1 when the compiled step
could not be built (the sentence says why; the engine then serves on its plain CUDA graphs).
"""

from __future__ import annotations

import sys

from qvl_agent.cli import add_engine_args, notify
from qvl_agent.errors import UsageError

NOTHING_TO_COMPILE = (
    "Nothing to compile: the compiled decode step is built only on a CUDA GPU, and {where} (a CPU decodes "
    "without compiling, so there is no cache to warm)."
)


def register(sub) -> None:
    p = sub.add_parser(
        "warm-up",
        help="compile the decode step once for this GPU and torch, for fast later starts",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 2)[2],
    )
    add_engine_args(p)
    p.set_defaults(func=run)


def no_gpu_reason(device: str) -> str:
    """Why there is nothing to compile on `device`, or "" when it is a usable CUDA GPU."""
    if device in ("cpu", "mps"):
        return f"--device {device} was asked for"
    import torch

    if not torch.cuda.is_available():
        return "this machine has none" if device == "auto" else f"torch sees none for --device {device}"
    return ""


def run(args, settings) -> int:
    if settings.engine != "local":
        raise UsageError(f"warm-up compiles the local engine; --engine {settings.engine} has nothing to compile.")
    reason = no_gpu_reason(settings.device)
    if reason:
        print(NOTHING_TO_COMPILE.format(where=reason))
        return 0
    from qvl_agent.devtools.ready import warm

    print(f"Loading {settings.model} and compiling its decode step (minutes the first time)...", file=sys.stderr)
    result = warm(settings, log=notify)
    if result["cache_folder"] is None:
        why = result["why_not_compiled"] or result["decode_path"]
        print(f"The decode step could not be compiled ({why}); starts use the plain CUDA graphs.", file=sys.stderr)
        return 1
    print(
        f"Compiled the decode step on {result['gpu']} in {result['compile_s']:.0f} s (ready after "
        f"{result['ready_s']:.1f} s); its cache ({result['cache_bytes'] / 2**20:.1f} MB) is in "
        f"{result['cache_folder']}, where later starts with this model load it."
    )
    return 0
