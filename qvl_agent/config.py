"""Settings: frozen dataclasses loaded once from the TOML file in the user's config dir and `QVL_*`
environment variables, then passed down. Nothing else in qvl-agent reads `os.environ` for settings.

Precedence: command-line flags (applied by the caller with `dataclasses.replace`) > environment > file >
defaults. Saving is atomic (write a temporary file, then rename), so a crash never leaves half a file;
a file that cannot be parsed is moved aside as `config.toml.bak-<time>` and defaults are used.
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from qvl_agent.errors import ConfigError

DEFAULT_MODEL = "Qwen/Qwen3-VL-2B-Instruct"
SAFETY_MODES = ("confirm", "auto", "dry-run")


@dataclass(frozen=True)
class Hotkeys:
    """pynput GlobalHotKeys syntax, e.g. "<ctrl>+<alt>+q"."""

    ask: str = "<ctrl>+<alt>+q"
    region: str = "<ctrl>+<alt>+r"
    stop: str = "<ctrl>+<alt>+<esc>"


@dataclass(frozen=True)
class Settings:
    model: str = DEFAULT_MODEL  # Hugging Face id or a local directory
    engine: str = "local"  # local | replay:FILE | openai:URL
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    max_pixels: int = 16_777_216  # cap on the pixels the model sees per screenshot (smart-resize bound)
    max_new_tokens: int = 512
    feature_cache_mb: int = 1024  # vision features kept by content hash
    session_memory_mb: int = 4096  # KV caches of idle sessions beyond this are evicted, oldest first
    speculative: bool = True  # greedy replies draft tool-call skeletons and n-grams, verified in one forward
    safety_mode: str = "confirm"  # confirm | auto | dry-run
    browser: str = ""  # a Chromium executable; empty: find one
    api_key: str = ""  # for --engine openai:URL
    api_token: str = ""  # for `qvl-agent serve`
    hotkeys: Hotkeys = field(default_factory=Hotkeys)

    def validated(self) -> Settings:
        """Self, or ConfigError naming the first value that cannot be used."""
        if self.max_pixels < 65_536:
            raise ConfigError(f"max_pixels must be at least 65536, not {self.max_pixels}.")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, not {self.max_new_tokens}.")
        if self.feature_cache_mb < 0 or self.session_memory_mb < 0:
            raise ConfigError("feature_cache_mb and session_memory_mb cannot be negative.")
        if self.safety_mode not in SAFETY_MODES:
            raise ConfigError(f"safety_mode must be one of {', '.join(SAFETY_MODES)}, not {self.safety_mode!r}.")
        if not (self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}.")
        if not self.model.strip():
            raise ConfigError("model cannot be empty.")
        return self


ENV_VARS = {
    "QVL_MODEL": "model",
    "QVL_ENGINE": "engine",
    "QVL_DEVICE": "device",
    "QVL_MAX_PIXELS": "max_pixels",
    "QVL_MAX_NEW_TOKENS": "max_new_tokens",
    "QVL_FEATURE_CACHE_MB": "feature_cache_mb",
    "QVL_SESSION_MEMORY_MB": "session_memory_mb",
    "QVL_SPECULATE": "speculative",
    "QVL_SAFETY_MODE": "safety_mode",
    "QVL_BROWSER": "browser",
    "QVL_API_KEY": "api_key",
    "QVL_API_TOKEN": "api_token",
}


def config_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("QVL_CONFIG_DIR"):
        return Path(env["QVL_CONFIG_DIR"])
    import platformdirs

    return Path(platformdirs.user_config_dir("qvl-agent", appauthor=False))


def config_path(env: dict[str, str] | None = None) -> Path:
    return config_dir(env) / "config.toml"


def _coerce(name: str, value, source: str):
    """Convert a raw value to the type of the Settings field `name`."""
    default = getattr(Settings(), name)
    if isinstance(default, int):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} in {source} must be a whole number, not {value!r}.") from None
    if not isinstance(value, str):
        raise ConfigError(f"{name} in {source} must be text, not {value!r}.")
    return value


def _from_mapping(data: dict, source: str) -> dict:
    known = {f.name for f in fields(Settings)}
    values = {}
    for key, value in data.items():
        if key == "hotkeys":
            if not isinstance(value, dict):
                raise ConfigError(f"[hotkeys] in {source} must be a table.")
            hk_known = {f.name for f in fields(Hotkeys)}
            unknown = set(value) - hk_known
            if unknown:
                raise ConfigError(f"Unknown hotkey {sorted(unknown)[0]!r} in {source}.")
            values["hotkeys"] = Hotkeys(**{k: str(v) for k, v in value.items()})
        elif key in known:
            values[key] = _coerce(key, value, source)
        else:
            raise ConfigError(f"Unknown setting {key!r} in {source}.")
    return values


# Every notice `load` gave in this process, for front ends that show them elsewhere than stderr (the tray).
NOTICES: list[str] = []


@dataclass(frozen=True)
class Loaded:
    settings: Settings
    path: Path
    notice: str = ""  # one sentence for the person, e.g. that a corrupt file was set aside


def load(path: Path | None = None, env: dict[str, str] | None = None) -> Loaded:
    """Settings from file and environment. A corrupt file is set aside and defaults are used."""
    env = os.environ if env is None else env
    path = path or config_path(env)
    values: dict = {}
    notice = ""
    if path.exists():
        try:
            values = _from_mapping(tomllib.loads(path.read_text(encoding="utf-8")), str(path))
            Settings(**values).validated()
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, ConfigError) as exc:
            backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
            path.replace(backup)
            values = {}
            notice = (
                f"The settings file {path} could not be used ({exc}); it was moved to {backup} and defaults are used."
            )
            NOTICES.append(notice)
    for var, name in ENV_VARS.items():
        if env.get(var):
            values[name] = _coerce(name, env[var], f"${var}")
    return Loaded(Settings(**values).validated(), path, notice)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def dumps(settings: Settings) -> str:
    lines = []
    for f in fields(Settings):
        if f.name in ("hotkeys", "api_token", "api_key"):
            continue  # secrets stay in the environment or their own 0600 files
        lines.append(f"{f.name} = {_toml_value(getattr(settings, f.name))}")
    lines.append("")
    lines.append("[hotkeys]")
    for f in fields(Hotkeys):
        lines.append(f"{f.name} = {_toml_value(getattr(settings.hotkeys, f.name))}")
    return "\n".join(lines) + "\n"


def save(settings: Settings, path: Path | None = None) -> Path:
    """Validate, then write atomically: readers see the old file or the new one, never half of one."""
    settings.validated()
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(dumps(settings), encoding="utf-8")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    tmp.replace(path)
    return path


def replace(settings: Settings, **changes) -> Settings:
    """`dataclasses.replace` that drops None values (unset command-line flags) and validates."""
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None}).validated()
