"""Typed text can never turn into code in an exported script, end to end: a real run in Chromium types
text built to break out of its literal (Unicode line separators that `str.splitlines` splits on and
Python's tokenizer does not, quotes, a payload) and then a secret; the exported script, replayed with
plain `python`, types exactly that text, runs no payload (the canary file is never created) and reads the
secret from the environment. A task that names `{{PASSWORD}}` (the README's example) exports a script
that runs. The script is private (0600), and --export never replaces a file that is already there."""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
import uuid

import pytest

from qvl_agent.playwright.chromium import find_browser
from qvl_agent.scripts.export.gate import PLAYWRIGHT_ATTRS
from tests.conftest import run_cli
from tests.pages.helpers import call, click_at, element_centres, write_replay
from tests.pages.server import PageServer


@pytest.fixture
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def _browse(tmp_path, url, replies, task, *extra, env=None):
    replay = write_replay(tmp_path / "replies.json", replies)
    return run_cli(
        "browse", "--url", url, "--engine", f"replay:{replay}", "--trace-dir", str(tmp_path / "run"), *extra,
        task, env={"QVL_CONFIG_DIR": str(tmp_path / "config"), **(env or {})}, timeout=180,
    )  # fmt: skip


def test_typed_text_built_to_break_out_of_its_literal_is_replayed_as_text_and_runs_nothing(tmp_path, server):
    canary = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {canary}')"
    # Each separator ends a "line" for str.splitlines but not for Python: an exporter that edits the
    # script by splitlines offsets puts the secret's env read in the wrong place and the payload runs.
    username = f'grace\u2028");{payload};("\x85\u2029\x0c"\\{{x}}'
    password = "pw-" + uuid.uuid4().hex
    url = server.url + "/login.html"
    at = element_centres(url, ["#username", "#password", "button"])
    replies = [
        click_at(at["#username"]),
        call(action="type", text=username),
        click_at(at["#password"]),
        call(action="type", text="{{PASSWORD}}"),
        click_at(at["button"]),
        call(action="terminate", status="success"),
    ]
    script = tmp_path / "signin.py"
    result = _browse(
        tmp_path, url, replies, "Sign in as grace with {{PASSWORD}}\u2028\"\"\"; import os", "--secret", "PASSWORD",
        "--export", str(script), env={"QVL_SECRET_PASSWORD": password},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    typed = server.records("login")[0]["username"]
    assert "\u2028" in typed and payload in typed  # the browser got the text as it was typed

    source = script.read_text(encoding="utf-8")
    tree = ast.parse(source)
    called = {
        node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        for node in ast.walk(next(n for n in tree.body if getattr(n, "name", "") == "replay"))
        if isinstance(node, ast.Call)
    }
    assert called <= PLAYWRIGHT_ATTRS | {"expect", "compile", "escape"}, called
    assert "system" not in called and "__import__" not in called
    assert "{{PASSWORD}}" in ast.get_docstring(tree)  # the task is text in the docstring, not an env read
    assert stat.S_IMODE(script.stat().st_mode) == 0o600
    assert not canary.exists()

    server.clear()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(QVL_SECRET_PASSWORD=password, QVL_BROWSER=find_browser())
    replayed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert replayed.returncode == 0, replayed.stderr  # the {{PASSWORD}} task no longer stops it with NameError
    assert server.records("login") == [{"username": typed, "password": password}]
    assert not canary.exists()


def test_export_never_replaces_a_file_that_is_already_there(tmp_path, server):
    mine = tmp_path / "notes.py"
    mine.write_text("my own work\n")
    result = _browse(tmp_path, server.url + "/login.html", [call(action="terminate", status="success")], "Look",
                     "--export", str(mine))  # fmt: skip
    assert result.returncode == 2
    assert "already exists" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert mine.read_text() == "my own work\n"
    assert not (tmp_path / "run").exists()  # refused before anything ran
