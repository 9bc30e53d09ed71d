"""Engines: `open_engine` turns an `--engine` spec into a resident engine.

local          the Qwen3-VL model on this machine (transformers), `--model` id or directory
replay:FILE    recorded replies from a JSON array of strings (tests, demos)
openai:URL     any OpenAI-compatible server (qvl-agent serve, vLLM, SGLang)

Every engine carries the model profile (`engine.profile`) that grounding asks and reads with: the one
the `profile` setting names, else the one `--model`'s own files (or name) point to. The local engine
also takes the profile's pixel budget when it is below the max_pixels setting.
"""

from __future__ import annotations

from collections.abc import Callable

from qvl_agent.config import Settings, replace
from qvl_agent.engine.base import STATS_KEYS, Engine, GenerationOptions, Session, TurnStats
from qvl_agent.errors import UsageError

__all__ = [
    "Engine",
    "GenerationOptions",
    "STATS_KEYS",
    "Session",
    "TurnStats",
    "check_engine",
    "describe_engine",
    "open_engine",
]


def open_engine(settings: Settings, spec: str | None = None, notify: Callable[[str], None] | None = None) -> Engine:
    """Build the engine named by `spec` (default `settings.engine`). Loading a model can take a while.
    `notify` gets one line saying which model profile was chosen, when it was chosen from the model."""
    from qvl_agent.profiles import choose

    profile, note = choose(settings.model, settings.profile)
    if note and notify is not None:
        notify(note)
    engine = _build(replace(settings, max_pixels=min(settings.max_pixels, profile.max_pixels)), spec)
    engine.profile = profile
    return engine


def _build(settings: Settings, spec: str | None) -> Engine:
    spec = spec or settings.engine
    if spec == "local":
        if not settings.device.startswith("cuda"):
            # A missing model is told before torch and transformers load (seconds of CPU). Only a CUDA
            # device can fail before the loader looks at the model, so its error keeps coming first.
            from qvl_agent.engine.model_dir import local_source

            local_source(settings.model)
        from qvl_agent.engine.qwen3vl import Qwen3VLEngine

        return Qwen3VLEngine.load(settings.model, device=settings.device, settings=settings)
    if spec.startswith("replay:"):
        from qvl_agent.engine.replay import ReplayEngine

        return ReplayEngine.from_file(spec.removeprefix("replay:"))
    if spec.startswith("openai:"):
        from qvl_agent.engine.remote import RemoteEngine

        return RemoteEngine(spec.removeprefix("openai:"), api_key=settings.api_key, model=settings.model)
    raise UsageError(f"Unknown engine {spec!r}: use local, replay:FILE or openai:URL.")


def check_engine(settings: Settings) -> None:
    """What can be told about the engine in milliseconds, without loading a model: a replay file that is
    missing or holds no replies, a server URL that is not http(s), an engine kind qvl-agent does not know.
    Commands call it before they make a run folder or take a port, so bad input is one sentence and no
    "failed to start" run."""
    spec = settings.engine
    if spec.startswith("replay:"):
        from qvl_agent.engine.replay import ReplayEngine

        ReplayEngine.from_file(spec.removeprefix("replay:"))
    elif spec.startswith("openai:"):
        from qvl_agent.engine.api_url import normalize_url

        normalize_url(spec.removeprefix("openai:"))
    elif spec != "local":
        raise UsageError(f"Unknown engine {spec!r}: use local, replay:FILE or openai:URL.")


def describe_engine(settings: Settings, engine: Engine | None = None) -> str:
    """The configured engine in words, e.g. "local model Qwen/Qwen3-VL-2B-Instruct on device auto", for
    `doctor` and the eval reports; a loaded `engine` adds the device auto resolved to."""
    from pathlib import Path

    spec = settings.engine
    if spec == "local":
        folder = Path(settings.model).expanduser()
        model = f"folder {folder.resolve()}" if folder.is_dir() else settings.model
        device = settings.device
        resolved = getattr(engine, "device", None)
        if resolved is not None and str(resolved) != device:
            device = f"{device} ({resolved})"
        elif device == "auto":
            device = "auto (a CUDA GPU when torch sees one, else the CPU)"
        return f"local model {model} on device {device}"
    if spec.startswith("replay:"):
        return f"replay file {Path(spec.removeprefix('replay:')).expanduser().resolve()} (recorded replies, no model)"
    if spec.startswith("openai:"):
        key = "with an API key" if settings.api_key else "without an API key"
        return f"remote OpenAI-compatible server {spec.removeprefix('openai:')}, model {settings.model}, {key}"
    return f"{spec!r}, which is not an engine qvl-agent knows (local, replay:FILE or openai:URL)"
