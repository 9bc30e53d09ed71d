"""A run folder holds screenshots and what was typed: after a real run (replay engine; a browser run and a
desktop dry run), every file in it is 0600 and every folder, including the runs folder it made above
it, 0700, even under umask 0 (where a plain open() or mkdir() makes world-writable files)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_desktop_e2e import call, replay


def modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def person(tmp_path) -> dict:
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "home" / ".local" / "share"),
        "QVL_CONFIG_DIR": str(tmp_path / "config"),
    }


@pytest.fixture()
def umask_zero():
    old = os.umask(0)  # the child inherits it
    yield
    os.umask(old)


def test_a_browser_run_writes_only_private_files_under_umask_zero(tmp_path, umask_zero):
    page = tmp_path / "page.html"
    page.write_text("<button style='width:300px;height:200px'>Go</button>")
    engine = replay(tmp_path, [call(action="left_click", coordinate=[100, 100]), call(action="answer", text="done")])
    done = run_cli("browse", "--engine", engine, "--url", page.as_uri(), "Press Go", env=person(tmp_path))
    assert done.returncode == 0, done.stderr
    runs = tmp_path / "home" / ".local" / "share" / "qvl-agent" / "runs"
    (run,) = list(runs.iterdir())
    found = modes(run)
    assert {"trace.jsonl", "step-001.png", "step-002.png", "browser.json", "report.html"} <= set(found)
    assert found.pop(".") == 0o700
    assert all(mode == 0o600 for mode in found.values()), {k: oct(v) for k, v in found.items()}
    for folder in (runs, runs.parent):  # made by the run: private too
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.display
def test_a_desktop_dry_run_writes_only_private_files_under_umask_zero(x_display, tmp_path, umask_zero):
    engine = replay(
        tmp_path, [call(action="left_click", coordinate=[500, 500]), call(action="terminate", status="success")]
    )
    trace = tmp_path / "new" / "runs" / "one"
    done = run_cli("run", "--engine", engine, "--dry-run", "--trace-dir", str(trace), "Click", env=person(tmp_path))
    assert done.returncode == 3, done.stderr
    found = modes(trace)
    assert {"trace.jsonl", "step-001.png", "report.html"} <= set(found)
    assert found.pop(".") == 0o700
    assert all(mode == 0o600 for mode in found.values()), {k: oct(v) for k, v in found.items()}
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
