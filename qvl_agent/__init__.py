"""qvl-agent: a local desktop agent on Qwen3-VL that sees the screen and acts on it."""

__version__ = "0.1.0"
