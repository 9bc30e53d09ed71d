"""Engines: `open_engine` turns an `--engine` spec into a resident engine.

local          the Qwen3-VL model on this machine (transformers), `--model` id or directory
replay:FILE    recorded replies from a JSON array of strings (tests, demos)
openai:URL     any OpenAI-compatible server (qvl-agent serve, vLLM, SGLang)
"""

from __future__ import annotations

from qvl_agent.config import Settings
from qvl_agent.engine.base import STATS_KEYS, Engine, GenerationOptions, Session, TurnStats
from qvl_agent.errors import UsageError

__all__ = ["Engine", "GenerationOptions", "STATS_KEYS", "Session", "TurnStats", "open_engine"]


def open_engine(settings: Settings, spec: str | None = None) -> Engine:
    """Build the engine named by `spec` (default `settings.engine`). Loading a model can take a while."""
    spec = spec or settings.engine
    if spec == "local":
        from qvl_agent.engine.qwen3vl import Qwen3VLEngine

        return Qwen3VLEngine.load(settings.model, device=settings.device, settings=settings)
    if spec.startswith("replay:"):
        from qvl_agent.engine.replay import ReplayEngine

        return ReplayEngine.from_file(spec.removeprefix("replay:"))
    if spec.startswith("openai:"):
        from qvl_agent.engine.remote import RemoteEngine

        return RemoteEngine(spec.removeprefix("openai:"), api_key=settings.api_key, model=settings.model)
    raise UsageError(f"Unknown engine {spec!r}: use local, replay:FILE or openai:URL.")
