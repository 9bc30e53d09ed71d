"""The gate every model-written Playwright script passes before anything runs it.

`check_script(source)` parses the script with `ast` and walks it against a strict allow-list: it may
import Playwright's sync API and a few harmless standard modules, read its browser from `--browser PATH`
or the `QVL_BROWSER` environment variable, drive pages and print. Anything else is refused with one
sentence naming the line and the reason: other imports (subprocess, socket, urllib, requests, httpx,
pathlib, ...), `os` beyond reading the environment, `eval`/`exec`/`compile`/`__import__`, reflection
(`getattr`, `globals`, dunder attributes), `open()` other than for reading, Playwright calls that write
files or start other programs (`path=`, `save_as`, browser `args`, a hard-coded `executable_path`).

The policy is deliberately conservative: a script that a person wrote by hand may well be refused. It
works on the syntax tree only; it never imports or runs the script.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from qvl_agent.errors import InputError

# module -> the attributes a script may use on it (None: any public attribute).
ALLOWED_MODULES: dict[str, frozenset[str] | None] = {
    "playwright.sync_api": None,
    "re": None,
    "time": None,
    "json": None,
    "math": None,
    "string": None,
    "typing": None,
    "datetime": None,
    "collections": None,
    "argparse": frozenset(
        {"ArgumentParser", "Namespace", "SUPPRESS", "REMAINDER", "ArgumentTypeError", "ArgumentError"}
    ),
    "sys": frozenset({"argv", "exit", "stdout", "stderr", "version_info", "platform"}),
    "os": frozenset({"environ", "getenv"}),
}

FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
        "memoryview",
        "help",
        "__builtins__",
        "__loader__",
        "__spec__",
        "classmethod",
        "staticmethod",
        "super",
        "type",
        "object",
    }
)

# Playwright methods that write files, read arbitrary local files into the page, or reach beyond the
# fresh browser the runner starts.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "save_as",
        "set_input_files",
        "launch_persistent_context",
        "connect",
        "connect_over_cdp",
        "launch_server",
        "expose_binding",
        "expose_function",
        "route_from_har",
        "storage_state",
        "start_chunk",
        "stop_chunk",
        "write_text",
        "write_bytes",
        "unlink",
        "rmdir",
        "mkdir",
        "system",
        "popen",
        "spawn",
        "FileType",
    }
)

# Keyword arguments that make Playwright write files or run other programs.
FORBIDDEN_KEYWORDS = frozenset(
    {
        "path",
        "ignore_default_args",
        "env",
        "downloads_path",
        "traces_dir",
        "record_video_dir",
        "record_har_path",
        "user_data_dir",
        "firefox_user_prefs",
    }
)

SAFE_BROWSER_ARGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
)

READ_MODES = frozenset({"r", "rt", "rb", "tr", "br"})


class ScriptRejected(InputError):
    """A script the policy refuses to run; the message says which line and why."""

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
    def __init__(self) -> None:
        self.module_aliases: dict[str, str] = {}  # local name -> allowed module it is bound to
        self.safe_arg_lists: set[str] = set()  # names bound (once) to a literal list of safe browser flags

    def fail(self, node: ast.AST, reason: str) -> None:
        raise ScriptRejected(getattr(node, "lineno", 0), reason)

    # --- imports --------------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_MODULES:
                self.fail(node, f"importing {alias.name!r} is not allowed (only {_allowed_list()})")
            if alias.asname is None and "." in alias.name:
                # `import playwright.sync_api` binds `playwright`, whose other submodules are off limits.
                self.fail(node, f"write `from {alias.name} import ...` instead of `import {alias.name}`")
            self.module_aliases[alias.asname or alias.name] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or module not in ALLOWED_MODULES:
            where = "." * node.level + module
            self.fail(node, f"importing from {where!r} is not allowed (only {_allowed_list()})")
        allowed = ALLOWED_MODULES[module]
        for alias in node.names:
            if alias.name == "*":
                if module != "playwright.sync_api":
                    self.fail(node, f"`from {module} import *` is not allowed")
                continue
            if alias.name.startswith("_") or (allowed is not None and alias.name not in allowed):
                self.fail(node, f"using {module}.{alias.name} is not allowed")

    # --- names and attributes -------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.fail(node, f"{node.id}() is not allowed")
        if node.id.startswith("__") and node.id not in ("__name__", "__file__"):
            self.fail(node, f"the name {node.id} is not allowed")
        module = self.module_aliases.get(node.id)
        if module and ALLOWED_MODULES[module] is not None:
            # Passing `os` or `sys` around would let a later attribute escape the per-module allow-list.
            self.fail(node, f"the module {module} may only be used as {node.id}.<attribute>")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self.fail(node, f"the private attribute .{node.attr} is not allowed")
        module = self.module_aliases.get(node.value.id) if isinstance(node.value, ast.Name) else None
        if module and ALLOWED_MODULES[module] is not None and node.attr not in ALLOWED_MODULES[module]:
            self.fail(node, f"using {module}.{node.attr} is not allowed")
        if node.attr in FORBIDDEN_ATTRIBUTES:
            why = "it writes files, runs programs or leaves the page"
            self.fail(node, f".{node.attr} is not allowed ({why})")
        if module:
            return  # the module name itself was checked just now
        self.generic_visit(node)

    # --- calls ----------------------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        for kw in node.keywords:
            if kw.arg in FORBIDDEN_KEYWORDS:
                why = "it writes files or changes how the browser starts"
                self.fail(node, f"the argument {kw.arg}= is not allowed ({why})")
            if kw.arg == "args":
                self._check_browser_args(node, kw.value)
            if kw.arg == "executable_path" and isinstance(kw.value, ast.Constant):
                self.fail(node, "executable_path must come from --browser or QVL_BROWSER, not a fixed path")
            if kw.arg is None:
                self.fail(node, "passing **keyword arguments is not allowed (they hide what is called)")
        if isinstance(node.func, ast.Name) and node.func.id == "open":
            self._check_open(node)
        self.generic_visit(node)

    def _check_browser_args(self, node: ast.Call, value: ast.expr) -> None:
        # Flags such as --renderer-cmd-prefix make Chromium run any program: only known-safe ones pass.
        if isinstance(value, ast.Name) and value.id in self.safe_arg_lists:
            return
        if not _is_safe_arg_list(value):
            allowed = " ".join(SAFE_BROWSER_ARGS)
            self.fail(node, f"args= may only be a literal list of these browser flags: {allowed}")

    def visit_Assign(self, node: ast.Assign) -> None:
        # `CHROMIUM_ARGS = [...]` with safe flags may be passed as args=CHROMIUM_ARGS later.
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if _is_safe_arg_list(node.value):
                self.safe_arg_lists.add(name)
            else:
                self.safe_arg_lists.discard(name)
        self.generic_visit(node)

    def _check_open(self, node: ast.Call) -> None:
        mode: ast.expr | None = node.args[1] if len(node.args) > 1 else None
        for kw in node.keywords:
            if kw.arg == "mode":
                mode = kw.value
        if mode is None:
            return
        if not (isinstance(mode, ast.Constant) and mode.value in READ_MODES):
            self.fail(node, "open() may only read files, not write them")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.fail(node, "async code is not allowed; use Playwright's sync API")


def _is_safe_arg_list(value: ast.expr) -> bool:
    return isinstance(value, ast.List | ast.Tuple) and all(
        isinstance(item, ast.Constant) and item.value in SAFE_BROWSER_ARGS for item in value.elts
    )


def _allowed_list() -> str:
    return ", ".join(ALLOWED_MODULES)


def check_script(source: str) -> None:
    """Raise ScriptRejected (one sentence with the line) unless `source` passes the policy."""
    if not source.strip():
        raise ScriptRejected(0, "The script is empty")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ScriptRejected(exc.lineno or 0, f"the script is not valid Python ({exc.msg})") from None
    if not any(isinstance(n, ast.ImportFrom) and n.module == "playwright.sync_api" for n in ast.walk(tree)):
        raise ScriptRejected(0, "The script must use Playwright's sync API (playwright.sync_api)")
    _Checker().visit(tree)


def verdict(source: str) -> Verdict:
    """The policy's answer as a value, for callers that report rather than raise."""
    try:
        check_script(source)
    except ScriptRejected as exc:
        return Verdict(False, exc.reason, exc.line)
    return Verdict(True)
