"""The architecture as a contract: import-linter checks the layers declared in pyproject.toml (front
ends on top, capture/engine/parse below, errors at the bottom; nothing imports the commands; the core
imports no torch, Qt, input devices or Playwright), and the wheel carries the prompt templates."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT

LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
)


def lint(folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(folder))
    return subprocess.run([sys.executable, "-c", LINT], cwd=folder, env=env, capture_output=True, text=True)


def test_the_import_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout and "9 kept" in out.stdout


def test_a_core_module_importing_a_command_breaks_the_contracts(tmp_path):
    shutil.copytree(ROOT / "qvl_agent", tmp_path / "qvl_agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    parse = tmp_path / "qvl_agent" / "parse.py"
    parse.write_text(
        parse.read_text() + "\n\ndef _late():\n    import qvl_agent.commands.run  # noqa\n    import torch\n"
    )
    out = lint(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "qvl_agent.parse -> qvl_agent.commands.run" in out.stdout
    assert "qvl_agent.parse -> torch" in out.stdout
    assert "BROKEN" in out.stdout


def test_the_sandbox_importing_what_it_confines_breaks_the_contracts(tmp_path):
    """The wall runs any script: it may not learn about saved scripts, the agent or Playwright."""
    shutil.copytree(ROOT / "qvl_agent", tmp_path / "qvl_agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    net = tmp_path / "qvl_agent" / "sandbox" / "net.py"
    net.write_text(
        net.read_text() + "\n\ndef _late():\n    import qvl_agent.scripts.header  # noqa\n    import playwright\n"
    )
    out = lint(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "qvl_agent.sandbox.net -> qvl_agent.scripts.header" in out.stdout
    assert "qvl_agent.sandbox.net -> playwright" in out.stdout


def test_the_wheel_carries_the_prompt_templates_and_they_load_from_it(tmp_path):
    build = tmp_path / "src"
    shutil.copytree(ROOT, build, ignore=shutil.ignore_patterns(".git", ".venv", "out", "__pycache__", "*.egg-info",
                                                               "build", "dist", "tests"))  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), "."],
        cwd=build, check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("qvl_agent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    sources = sorted(p.name for p in (ROOT / "prompts").glob("*.txt"))
    assert sources and sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("qvl_agent/templates/")
                              and n.endswith(".txt")) == sources  # fmt: skip
    # Installed into a bare folder, the package finds its templates without the source tree.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import qvl_agent.prompts as p; print(p.__file__); "
        "print(p.load('computer_use').render(screen_width=1000, screen_height=1000), end='')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(site)))  # fmt: skip
    assert out.returncode == 0, out.stderr
    where, rendered = out.stdout.split("\n", 1)
    assert where.startswith(str(site))  # the installed copy, not the source tree
    from qvl_agent import prompts

    assert rendered == prompts.load("computer_use").render(screen_width=1000, screen_height=1000)
    assert "computer_use" in rendered
