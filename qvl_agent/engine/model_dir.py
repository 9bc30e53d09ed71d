"""Where the local engine loads its model from, told from the file system alone: no torch, no transformers.

`local_source(model)` is `--model` as the loader takes it (a folder, or a Hugging Face id), or
`ModelNotFoundError` for a path that is not there or a folder that holds no model. Checked before the
seconds of importing torch and transformers, a mistyped `--model` is one sentence at once.
"""

from __future__ import annotations

from pathlib import Path

from qvl_agent.errors import ModelNotFoundError


def local_source(model_id: str) -> tuple[str, bool]:
    """(what to load from, whether it is a folder on this machine)."""
    path = Path(model_id).expanduser()
    is_dir = path.is_dir()
    if not is_dir and (model_id.startswith((".", "/", "~")) or path.exists()):
        raise ModelNotFoundError(f"The model directory {model_id} does not exist.")
    if is_dir and not (path / "config.json").exists():
        raise ModelNotFoundError(f"{model_id} does not hold a model (no config.json in it).")
    return (str(path) if is_dir else model_id), is_dir
