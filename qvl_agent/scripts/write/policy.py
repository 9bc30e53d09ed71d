"""Advice for the model on the Playwright scripts it writes: a lint, NOT a security boundary.

`check_script(source)` parses the script with `ast` and refuses, with one sentence naming the line, what
would make a script fail or miss its point when it runs unattended in the sandbox. The message goes back
to the model, which writes a better script:

- not valid Python, or a source encoding other than UTF-8 (the saved file is UTF-8);
- no use of Playwright's sync API (`from playwright.sync_api import ...`), or async code;
- modules that a Playwright script has no use for, because they do the page's work around the page
  (subprocess, socket, requests, ...), or that are not installed here;
- running other programs or code from text (`os.system`, `eval`, `exec`, `__import__`), `input()`;
- attaching to a browser instead of launching a fresh one (`connect_over_cdp`);
- a file written to an absolute path or outside the working folder (only files in it are kept).

Ordinary code passes: printing in loops, `open()` for a CSV, `os.makedirs`, paths built at run time,
argparse, classes, `getattr`, a headed browser (`headless=False`: the sandbox runs it headless). Python's
reflection means any lint over it can be bypassed, so nothing here stands between a script and the machine:
every run of a script (verification, `qvl-agent replay`, the tray, the MCP server) goes through the bubblewrap
sandbox (`qvl_agent/sandbox/`), which is the wall. It works on the syntax tree only; it never imports or runs
the script.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tokenize
from dataclasses import dataclass

from qvl_agent.errors import InputError
from qvl_agent.scripts.write.policy_rules import (
    ATTACHING,
    CODE_FROM_TEXT,
    NOT_NEEDED_MODULES,
    OS_PROGRAM_RUNNERS,
    WRITES_TO_PATH,
)


class ScriptRejected(InputError):
    """A script the lint sends back to the model; the message says which line and why."""

    def __init__(self, line: int, reason: str):
        super().__init__(f"Line {line}: {reason}." if line else f"{reason}.")
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    line: int = 0


class _Checker(ast.NodeVisitor):
    def fail(self, node: ast.AST, reason: str) -> None:
        raise ScriptRejected(getattr(node, "lineno", 0), reason)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.level:
            self._check_module(node, node.module or "")
            for alias in node.names:
                if node.module == "os" and alias.name in OS_PROGRAM_RUNNERS:
                    self._runs_programs(node, f"os.{alias.name}")

    def _check_module(self, node: ast.AST, name: str) -> None:
        if name == "playwright.async_api" or name == "asyncio":
            self.fail(node, f"{name} is not needed: use Playwright's sync API (from playwright.sync_api import ...)")
        for module, why in NOT_NEEDED_MODULES.items():
            if name == module or name.startswith(module + "."):
                self.fail(node, f"importing {name} is not needed in a Playwright script: {why}")
        top = name.split(".")[0]
        if top and top not in sys.stdlib_module_names and importlib.util.find_spec(top) is None:
            self.fail(node, f"the module {top} is not installed here; use Playwright and the standard library")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr in OS_PROGRAM_RUNNERS:
            self._runs_programs(node, f"os.{node.attr}")
        if node.attr in ATTACHING:
            self.fail(
                node,
                f".{node.attr}() attaches to another browser; launch a fresh one with "
                "p.chromium.launch(executable_path=os.environ['QVL_BROWSER'])",
            )
        self.generic_visit(node)

    def _runs_programs(self, node: ast.AST, what: str) -> None:
        self.fail(node, f"{what} is not needed: a Playwright script drives the page, it runs no other programs")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in CODE_FROM_TEXT:
            self.fail(node, f"{node.id}() is not needed: write the code out")
        if node.id == "input":
            self.fail(node, "input() gets no answer: the script runs unattended; take values from sys.argv")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else ""
        for kw in node.keywords:
            if kw.arg == "path" and name in WRITES_TO_PATH:
                self._check_path(node, kw.value)
        if name == "save_as" and node.args:
            self._check_path(node, node.args[0])
        self.generic_visit(node)

    def _check_path(self, node: ast.Call, value: ast.expr) -> None:
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and not _is_relative_inside(value.value):
            self.fail(
                node,
                f"write files to a relative path such as 'shot.png', not {value.value[:60]!r}: only files in the "
                "working folder are kept",
            )

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.fail(node, "async code is not needed; use Playwright's sync API")


def _is_relative_inside(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return bool(path) and not path.startswith(("/", "~")) and ".." not in parts and "\0" not in path


def check_script(source: str) -> None:
    """Raise ScriptRejected (one sentence with the line) when the lint has advice for `source`."""
    if not source.strip():
        raise ScriptRejected(0, "The script is empty")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:  # ast.parse would raise this, not a SyntaxError
        line = source.count("\n", 0, exc.start) + 1
        reason = f"the script holds a lone surrogate ({ascii(source[exc.start])}), which is no character"
        raise ScriptRejected(line, reason) from None
    try:
        tree = ast.parse(source)
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source.encode("utf-8", "surrogatepass")).readline)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", 0) or 0
        raise ScriptRejected(line, f"the script is not valid Python ({getattr(exc, 'msg', exc)})") from None
    if encoding not in ("utf-8", "utf-8-sig"):
        # The script is saved as UTF-8 and Python decodes the file as its declaration says: under another
        # encoding it would not be the script the model wrote.
        raise ScriptRejected(1, f"a source encoding other than UTF-8 ({encoding}) is not allowed")
    if not any(isinstance(n, ast.ImportFrom) and n.module == "playwright.sync_api" for n in ast.walk(tree)):
        raise ScriptRejected(0, "The script must use Playwright's sync API (playwright.sync_api)")
    _Checker().visit(tree)


def verdict(source: str) -> Verdict:
    """The lint's answer as a value, for callers that report rather than raise."""
    try:
        check_script(source)
    except ScriptRejected as exc:
        return Verdict(False, exc.reason, exc.line)
    return Verdict(True)
