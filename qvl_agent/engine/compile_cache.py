"""Where torch's compile cache lives between starts, and what `qvl-agent warm-up` leaves there.

One folder per GPU model and torch build, one below it per compiled-code key (`cache_key`):

    <user cache>/qvl-agent/compile/<gpu>-torch<version>/<key>/
        (inductor's own caches: FX graphs, kernels; TORCHINDUCTOR_CACHE_DIR points here while compiling)
        artifacts.bin   torch.compiler.save_cache_artifacts() after a warm-up: the whole cache in one file
        warm.json       what was warmed up, when, and how long it took

A start loads `artifacts.bin` (`torch.compiler.load_cache_artifacts`) before compiling, so a folder that
travelled as one file, or whose inductor files were cleaned away, still compiles warm. A folder whose
`artifacts.bin` or `warm.json` cannot be read is moved aside (`KEY.unreadable-TIME`) with one sentence to
the person, and a fresh one is built: a broken cache costs a cold compile, never a failed start.
This module knows nothing of the engine: it is given the key, the GPU's name and torch's version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ARTIFACTS = "artifacts.bin"
MANIFEST = "warm.json"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_key(config: dict, shapes: Sequence[int], torch_version: str, gpu: str, dtype: str) -> str:
    """A short hash of what the compiled code depends on: the model's config (`config.to_dict()`; where
    it was loaded from does not count), the KV shapes, torch, the GPU and the dtype."""
    config = {k: v for k, v in config.items() if k != "_name_or_path"}
    material = json.dumps([config, list(shapes), torch_version, gpu, dtype], sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def machine_tag(gpu: str, torch_version: str) -> str:
    """`NVIDIA H100 80GB HBM3`, `2.14.1+cu130` -> `nvidia-h100-80gb-hbm3-torch2.14.1-cu130`."""
    slug = re.sub(r"[^a-z0-9.]+", "-", f"{gpu}-torch{torch_version}".lower()).strip("-")
    return slug or "unknown"


def cache_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("qvl-agent", appauthor=False)) / "compile"


def cache_dir(key: str, gpu: str = "", torch_version: str = "") -> Path:
    """The folder of compiled code `key` on this GPU model with this torch."""
    return cache_root() / machine_tag(gpu, torch_version) / key


def use_cache_dir(key: str, gpu: str = "", torch_version: str = "", notify: Callable[[str], None] = _stderr) -> str:
    """Point inductor's on-disk caches (FX graph and kernels) at the folder for `key`, unless the person
    chose one with TORCHINDUCTOR_CACHE_DIR, and load a warm-up's artifacts found there. Returns the
    folder in use."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Torch writes its default into the variable the first time it asks; that is not the person's choice.
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if not chosen or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        path = cache_dir(key, gpu, torch_version)
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    load_artifacts(folder, notify)
    return str(folder)


def load_artifacts(folder: Path, notify: Callable[[str], None] = _stderr) -> bool:
    """Load the warm-up's artifacts in `folder` into torch's caches. True when there were some and they
    loaded; a folder whose artifacts or manifest cannot be read is set aside and made afresh (False)."""
    manifest, artifacts = folder / MANIFEST, folder / ARTIFACTS
    problem = ""
    if manifest.exists():
        try:
            json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            problem = f"{MANIFEST}: {type(exc).__name__}"
    if not problem and artifacts.exists():
        try:
            data = artifacts.read_bytes()
        except OSError as exc:
            data, problem = b"", f"{ARTIFACTS}: {type(exc).__name__}"
        if data and _load(data) is None:
            problem = f"{ARTIFACTS} does not load in torch {_torch_version()}"
        elif not problem:
            return bool(data)
    if problem:
        aside = set_aside(folder)
        notify(
            f"The compile cache in {folder} could not be read ({problem}); it was moved to {aside.name} "
            "and the compiled step is built afresh."
        )
    return False


def _load(data: bytes):
    """torch.compiler.load_cache_artifacts, without torch's traceback in the log for a bad file."""
    import torch

    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        return torch.compiler.load_cache_artifacts(data)
    except Exception:
        return None
    finally:
        logger.setLevel(level)


def _torch_version() -> str:
    import torch

    return torch.__version__


def set_aside(folder: Path) -> Path:
    """Move `folder` to a sibling `NAME.unreadable-TIME` and make `folder` again, empty."""
    aside = folder.with_name(f"{folder.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        aside, n = folder.with_name(f"{folder.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    folder.rename(aside)
    folder.mkdir(parents=True)
    return aside


def save_artifacts(folder: Path, about: dict) -> int:
    """Write what torch compiled in this process to `folder` as one file, and `about` (what, how long) as
    its manifest. Returns the artifacts' size in bytes (0: nothing was compiled)."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    data = saved[0] if saved is not None else b""
    if data:
        tmp = folder / (ARTIFACTS + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(folder / ARTIFACTS)  # a start never sees half a file
    manifest = {**about, "torch": torch.__version__, "bytes": len(data), "written": time.strftime("%Y-%m-%d %H:%M")}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return len(data)
