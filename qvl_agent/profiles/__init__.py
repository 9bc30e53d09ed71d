"""Model profiles: each GUI model's published grounding setup, as data (one module per family).

    get(name)               the profile --profile NAME names; UsageError listing the names otherwise
    choose(model, name)     the profile for a model id or folder (--model), or the one named; with a
                            line for the person saying which was chosen and why ("" when nothing to say)

A model is recognised from its own files: the folder's name, `config.json`'s name fields, the model
card (README.md) and the chat template, in that order, each searched for a family's name fragments
(fine-tunes first, since their cards name the Qwen3-VL base). An unknown Qwen3-VL checkpoint
(model_type qwen3_vl) gets the Qwen3-VL-Instruct profile, with a line saying so. Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from qvl_agent.errors import UsageError
from qvl_agent.profiles import gui_owl, mai_ui, qwen3_vl, ui_venus
from qvl_agent.profiles.base import Profile, Score

__all__ = ["DEFAULT", "PROFILES", "Profile", "Score", "choose", "get"]

DEFAULT = qwen3_vl.PROFILE
# Fine-tunes before their base: a fine-tune's card names Qwen3-VL too.
PROFILES: dict[str, Profile] = {
    p.name: p for p in (ui_venus.PROFILE, mai_ui.PROFILE, gui_owl.PROFILE, qwen3_vl.PROFILE)
}
_READ_LIMIT = 65_536  # of a model card or template: the name is near the top


def get(name: str) -> Profile:
    try:
        return PROFILES[name.strip().lower()]
    except KeyError:
        raise UsageError(f"There is no profile {name!r}; the profiles are {', '.join(PROFILES)}.") from None


def _read(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(_READ_LIMIT)
    except OSError:
        return ""


def _json(path: Path) -> dict:
    """A JSON object file's contents; {} when it is missing, too long or not a JSON object."""
    try:
        value = json.loads(_read(path) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _clues(model: str) -> list[tuple[str, str]]:
    """(where, lower-case text) to search, most telling first."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return [("its name", model.lower())]
    config = _json(folder / "config.json")
    names = " ".join(str(config.get(k, "")) for k in ("_name_or_path", "name_or_path", "model_name"))
    template = _read(folder / "chat_template.jinja") + _read(folder / "chat_template.json")
    template += str(_json(folder / "tokenizer_config.json").get("chat_template", ""))
    return [
        ("its folder name", folder.resolve().name.lower()),
        ("its config.json", names.lower()),
        ("its model card", _read(folder / "README.md").lower()),
        ("its chat template", template.lower()),
    ]


def _is_qwen3vl(model: str) -> bool:
    folder = Path(model).expanduser()
    if folder.is_dir():
        config = _json(folder / "config.json")
        architectures = config.get("architectures")
        return config.get("model_type") == "qwen3_vl" or (
            isinstance(architectures, list) and "Qwen3VLForConditionalGeneration" in architectures
        )
    return "qwen3-vl" in model.lower()


def choose(model: str, name: str = "") -> tuple[Profile, str]:
    """The profile for `model` (a Hugging Face id, a folder or a served model's name), or the one `name`
    names; and one line saying which was chosen when it was not named ("" for the default model)."""
    if name:
        return get(name), ""
    for where, text in _clues(model):
        for profile in PROFILES.values():
            if any(fragment in text for fragment in profile.names):
                if profile is DEFAULT and where == "its name" and model in DEFAULT.hf_ids:
                    return profile, ""
                return profile, f"using the {profile.name} profile ({profile.title}), chosen from {where}."
    if _is_qwen3vl(model):
        return DEFAULT, (
            f"{model} is a Qwen3-VL checkpoint of no known family: using the {DEFAULT.name} profile "
            f"({DEFAULT.title}); pick another with --profile {'|'.join(PROFILES)}."
        )
    return DEFAULT, (
        f"{model} is no model family qvl-agent knows: using the {DEFAULT.name} profile ({DEFAULT.title}); "
        f"pick another with --profile {'|'.join(PROFILES)}."
    )
