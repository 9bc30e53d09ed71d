"""A PATH that lacks one program: a machine where that package is not installed."""

from __future__ import annotations

from pathlib import Path


def path_without(program: str, folder: Path) -> str:
    """A PATH (one folder, made in `folder`) holding every program of /usr/bin but `program`."""
    bin_dir = folder / f"bin-without-{program}"
    bin_dir.mkdir()
    for found in Path("/usr/bin").iterdir():
        if found.name != program:
            (bin_dir / found.name).symlink_to(found)
    return str(bin_dir)
