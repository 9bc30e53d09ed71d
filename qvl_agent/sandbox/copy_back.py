"""Where the files a sandboxed script wrote go: only into a folder made new for them.

A script, model-written or replayed, chose these names (a page can serve a download under any name), so
the rule is narrow:

- only into a NEW folder (`new_folder` makes it; nothing in it existed before), so no file of the
  person's is ever replaced, beside the script or in any subfolder;
- only documents, data and media (`KEPT_SUFFIXES`): nothing that something runs by itself (conftest.py,
  a Makefile, a .desktop launcher, package.json's scripts);
- never a hidden name (`.git/config`, `.ssh/authorized_keys`, `.config/autostart/...`), never an agent or
  instruction file that a coding assistant or installer reads (`AGENTS.md`, `CLAUDE.md`,
  `requirements.txt`, ...), never an absolute path or `..`.

Nothing here runs anything: `scripts/write/writer.py` (verification) and `scripts/replay.py` call `keep_files`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

KEPT_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".pdf", ".webm", ".har", ".gif", ".webp", ".bmp", ".txt", ".csv", ".tsv", ".json",
     ".xml", ".md", ".log", ".zip", ".gz", ".tgz", ".xlsx", ".xls", ".docx", ".doc", ".pptx", ".odt", ".ods",
     ".odp", ".rtf", ".mp4", ".mp3", ".wav", ".ogg", ".ics", ".vcf", ".parquet"}
)  # fmt: skip
# Files that tools read as instructions or install from, whatever folder they are in.
NEVER_KEPT_NAMES = frozenset(
    {"package.json", "composer.json", "deno.json", "agents.md", "claude.md", "gemini.md", "copilot-instructions.md",
     "requirements.txt", "constraints.txt", "dev-requirements.txt", "pipfile.lock", "conventions.md"}
)  # fmt: skip
MAX_PARTS = 16  # folders inside the new folder


@dataclass
class Kept:
    folder: Path | None = None  # the new folder, None when nothing was kept
    written: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # names not kept, as the script gave them


def allowed_name(name: str) -> PurePosixPath | None:
    """`name` as a relative path that may be kept, or None."""
    if not name or "\0" in name or "\\" in name or not name.isprintable():
        return None
    path = PurePosixPath(name)
    parts = path.parts
    if path.is_absolute() or not parts or len(parts) > MAX_PARTS:
        return None
    if any(part.startswith(".") or part in ("", "..") for part in parts):
        return None
    lower = parts[-1].lower()
    if path.suffix.lower() not in KEPT_SUFFIXES or lower in NEVER_KEPT_NAMES or lower.startswith("requirements"):
        return None
    return path


def new_folder(wanted: Path, numbered: bool) -> Path:
    """Make `wanted` as a new folder; when it exists and `numbered`, the first free `wanted-2`, `wanted-3`, ...
    Raises FileExistsError when it exists and not `numbered`."""
    for n in range(1, 1000 if numbered else 2):
        candidate = wanted if n == 1 else wanted.with_name(f"{wanted.name}-{n}")
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{wanted} already exists.")


def keep_files(files: dict[str, bytes], wanted: Path, *, numbered: bool = True) -> Kept:
    """Write the allowed `files` into a new folder at `wanted` (see `new_folder`); made only when there is
    something to keep. Every file is created anew (O_EXCL): nothing existing is opened for writing."""
    kept = Kept()
    allowed = {}
    for name in sorted(files):
        path = allowed_name(name)
        if path is None:
            kept.refused.append(name)
        else:
            allowed[path] = files[name]
    if not allowed:
        return kept
    kept.folder = new_folder(wanted, numbered)
    for path, data in allowed.items():
        target = kept.folder.joinpath(*path.parts)
        try:
            _make_parents(kept.folder, path)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            kept.refused.append(str(path))  # e.g. "a.png" and "a.png/b.png": the second cannot be made
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        kept.written.append(target)
    return kept


def _make_parents(folder: Path, path: PurePosixPath) -> None:
    current = folder
    for part in path.parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            raise OSError(f"{current} is not a folder")
        current.mkdir(mode=0o700, exist_ok=True)  # made here, inside the new folder, or already made here
