"""README.md's examples, typed as a newcomer would type them.

Every ```console block either runs here or carries, on the line just above it, a comment that says why
not (`<!-- not run: REASON -->`). A block without prompts is commands only (it pastes as it is); in a
block with prompts, `$ ` starts a command, `> ` continues it (a backslash line or a here-document) and
any other line is output the reader is shown, which must appear in what the commands print. The blocks
run in order, each as one bash script under `set -e`, in one working folder and a fresh home folder, so
a later block may use the files an earlier one made. A block exits 0 unless a comment above it says
`<!-- exit status: N -->`.

Where a command needs a model and names none, the replay engine answers (QVL_ENGINE): each reply is a
click in the middle of the screen and then `terminate`, which `ask`, `locate`, `run` and `browse` all
accept. The examples' image placeholder (`shot.png`) is given; everything else they make themselves. A
block that would act on a real desktop, reach the network or need real weights is marked, not run.

Links from README.md and docs/ to files and headings in this repository must resolve.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

from qvl_agent.playwright.chromium import find_browser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
EXIT_STATUS = re.compile(r"^<!-- exit status: (\d+) -->$")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lines: list[str]
    not_run: str = ""  # the reason, when marked
    exit_status: int = 0
    commands: list[str] = field(default_factory=list)  # the script, prompts removed
    output: list[str] = field(default_factory=list)  # lines shown as output

    def __post_init__(self):
        if not any(text.startswith("$ ") for text in self.lines):
            self.commands = list(self.lines)  # no prompts: commands only, to paste as they are
            return
        for text in self.lines:
            if text.startswith(("$ ", "> ")) or text == ">":
                self.commands.append(text[2:])
            elif text.strip():
                self.output.append(text.strip())

    @property
    def script(self) -> str:
        return "\n".join(self.commands) + "\n"

    def where(self) -> str:
        return f"README.md line {self.line}"


def console_blocks(markdown: str) -> list[Block]:
    """The ```console blocks, with the marks on the non-blank line just above each."""
    lines = markdown.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            end = lines.index("```", i + 1)
            block = Block(i + 1, lines[i + 1 : end])
            if m := NOT_RUN.match(above):
                block.not_run = m.group(1)
            if m := EXIT_STATUS.match(above):
                block.exit_status = int(m.group(1))
            blocks.append(block)
            i = end
        i += 1
    return blocks


BLOCKS = console_blocks(README.read_text(encoding="utf-8"))


def test_every_console_block_runs_or_says_why_not():
    assert len(BLOCKS) >= 8
    for block in BLOCKS:
        assert any(c.strip() for c in block.commands), f"{block.where()}: an empty console block"
        first = block.lines[0]
        assert not block.output or first.startswith("$ "), f"{block.where()}: output before the first command"
    marked = [b for b in BLOCKS if b.not_run]
    run = [b for b in BLOCKS if not b.not_run]
    assert len(run) >= 5, "most of README's examples must run; only what cannot run here is marked"
    # The two commands stay exactly what a fresh machine needs, and are the heavy jobs, so they are marked.
    commands = {b.commands[0]: b for b in marked}
    assert "scripts/demo" in commands and "scripts/test" in commands
    for script in ("scripts/demo", "scripts/test", "scripts/setup"):
        assert os.access(ROOT / script, os.X_OK), f"{script} must be executable"
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"
    # A mark anywhere but right above a console block would silently mark nothing.
    text = README.read_text(encoding="utf-8")
    assert text.count("<!-- not run:") == len(marked)


def test_readme_stays_short_and_names_no_unpublished_install():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    assert "pip install 'qvl-agent" not in text and 'pip install "qvl-agent' not in text
    assert "pip install qvl-agent" not in text


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    found = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_to_files_and_headings_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        assert linked.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(linked), f"{page.name} links to {target}: no such heading"


def _reply(**arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
def workspace(tmp_path, x_display):
    """A working folder with the examples' placeholder image, and the environment of a fresh account."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    Image.new("RGB", (1280, 800), (236, 239, 244)).save(work / "shot.png")
    replies = tmp_path / "any-model.json"
    click_then_stop = (
        _reply(action="left_click", coordinate=[500, 500]) + "\n" + _reply(action="terminate", status="success")
    )
    replies.write_text(json.dumps([click_then_stop] * 50))
    private = ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QVL_") and k not in private}
    env.update(
        HOME=str(home),
        # The qvl-agent and python of this environment, as after `source .venv/bin/activate`.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        DISPLAY=x_display,
        QVL_ENGINE=f"replay:{replies}",
        QVL_BROWSER=find_browser(None, os.environ.get("QVL_BROWSER", "")),
        PYTHONUNBUFFERED="1",
    )
    return work, env


@pytest.mark.browser
@pytest.mark.display
@pytest.mark.slow
def test_readme_examples_run_as_written(workspace):
    work, env = workspace
    ran = 0
    for block in BLOCKS:
        if block.not_run:
            continue
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.script],
            cwd=work, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        said = f"{block.where()}:\n{block.script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        assert done.returncode == block.exit_status, said
        assert "Traceback" not in done.stderr, said
        printed = {line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()}
        for shown in block.output:
            assert shown in printed, f"README shows {shown!r}, which the command did not print.\n{said}"
        ran += 1
    assert ran == sum(1 for b in BLOCKS if not b.not_run)
    # What the try-it section promises the reader: a replayable script and a report.
    assert "get_by_role" in (work / "greet.py").read_text() and (work / "run1" / "report.html").is_file()
