"""Prompt templates as data files in `prompts/`, loaded by name with their placeholders checked.

Templates use `string.Template` syntax (`$name` or `${name}`), so JSON braces in a tool schema need no
escaping. `render` refuses a missing or an unexpected value: a prompt never goes out half-filled.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from qvl_agent.errors import ConfigError


def _prompt_dir():
    # A wheel carries the top-level prompts/ folder as qvl_agent/templates (pyproject's package-dir
    # mapping); a source checkout reads it where it lies, next to the package.
    packaged = resources.files("qvl_agent") / "templates"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str

    @property
    def placeholders(self) -> set[str]:
        return {
            m.group("named") or m.group("braced")
            for m in string.Template.pattern.finditer(self.text)
            if m.group("named") or m.group("braced")
        }

    def render(self, **values) -> str:
        missing = self.placeholders - set(values)
        extra = set(values) - self.placeholders
        if missing or extra:
            raise ConfigError(
                f"Prompt {self.name!r} needs {sorted(self.placeholders)}; "
                f"missing {sorted(missing)}, unexpected {sorted(extra)}."
            )
        return string.Template(self.text).substitute(**{k: str(v) for k, v in values.items()})


@cache
def load(name: str) -> Prompt:
    """The prompt `prompts/<name>.txt`."""
    path = _prompt_dir() / f"{name}.txt"
    try:
        return Prompt(name, path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"There is no prompt named {name!r} (looked for {path}).") from None
