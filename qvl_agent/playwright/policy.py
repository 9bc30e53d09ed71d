"""The gate every model-written Playwright script passes before anything runs it.

`check_script(source)` parses the script with `ast` and walks it against a strict allow-list: it may
import Playwright's sync API and a few harmless standard modules, read its browser from `--browser PATH`
or the `QVL_BROWSER` environment variable, drive pages and print. Anything else is refused with one
sentence naming the line and the reason: other imports (subprocess, socket, urllib, requests, httpx,
pathlib, typing, ...), `os` beyond reading the environment, `eval`/`exec`/`compile`/`__import__`,
reflection (`getattr`, `globals`, dunder attributes, frames, attributes named by a class pattern
`case C(attr=x)` or a format field `'{0.__class__}'.format(x)`), a source encoding other than UTF-8 (the
file would decode to other code than was checked), `open()`, string annotations, Playwright calls
that read or write local files, start other programs or send traffic elsewhere (`path=` but a relative
screenshot/pdf path, `save_as` but to a relative path, `set_files`, `storage_state=`, `client_certificates=`, `proxy=`,
`request.new_context()`, tracing names with folders, browser flags off the allow-list, an
`executable_path` from anything but QVL_BROWSER or `--browser`), argparse's file readers, and printing
without bound (in a loop, or a string repeated by a large or unknown count). A name bound to an import is
that import everywhere in the script: binding it to anything else, anywhere, is refused.

This is a lint, not the wall: it gives the model fast, clear reasons. What a script that slips through can
reach is decided by the operating system sandbox it is verified in (`sandbox.py`). The policy is
deliberately conservative: a script that a person wrote by hand may well be refused. It works on the
syntax tree only; it never imports or runs the script. The rules on which browser a script may launch and
with which flags are `policy_launch.py`'s; the lists the rules name are `policy_rules.py`'s.
"""

from __future__ import annotations

import ast
import io
import re
import string
import tokenize
from dataclasses import dataclass

from qvl_agent.errors import InputError
from qvl_agent.playwright.bindings import Bindings
from qvl_agent.playwright.policy_launch import LaunchRules
from qvl_agent.playwright.policy_rules import (
    ALLOWED_MODULES,
    DANGEROUS_FLAG_PARTS,
    FORBIDDEN_ATTRIBUTES,
    FORBIDDEN_KEYWORDS,
    FORBIDDEN_NAMES,
    INTERNAL_ATTRIBUTES,
    NOT_FROM_IMPORTABLE,
    PARSER_KEYWORDS,
    REQUEST_METHODS,
)


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
    def __init__(self, names: Bindings) -> None:
        self.names = names
        self.launch = LaunchRules(names, self.fail)
        # local name -> the module it is bound to, known before the walk: a use above the import, in a
        # function or a loop, is checked like any other.
        self.module_aliases: dict[str, str] = {
            name: module for name, (module, member) in names.imports.items() if member is None
        }

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
        self._check_single_binding(node)

    def _check_single_binding(self, node: ast.Import | ast.ImportFrom) -> None:
        # A name bound to a module (or a module's member) is that and nothing else, anywhere in the script.
        for alias in node.names:
            name = alias.asname or alias.name.split(".")[0]
            if len(self.names.bound.get(name, [])) > 1:
                self.fail(node, f"the name {name} is bound to an import and to something else; use another name")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or module not in ALLOWED_MODULES:
            where = "." * node.level + module
            self.fail(node, f"importing from {where!r} is not allowed (only {_allowed_list()})")
        allowed = ALLOWED_MODULES[module]
        for alias in node.names:
            if alias.name == "*":
                self.fail(node, f"`from {module} import *` is not allowed (name what you use)")
            if alias.name.startswith("_") or (allowed is not None and alias.name not in allowed):
                self.fail(node, f"using {module}.{alias.name} is not allowed")
            if (module, alias.name) in NOT_FROM_IMPORTABLE:
                self.fail(node, f"write {module}.{alias.name} instead of importing {alias.name}")
        self._check_single_binding(node)

    # --- names and attributes -------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "open":
            self.fail(node, "open() is not allowed (a script reads and writes no files)")
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
        if node.attr in FORBIDDEN_ATTRIBUTES and not self._saves_into_scratch(node):
            why = "it writes or reads files, runs programs or leaves the page"
            self.fail(node, f".{node.attr} is not allowed ({why})")
        if node.attr in INTERNAL_ATTRIBUTES:
            self.fail(node, f".{node.attr} is not allowed (it reaches the interpreter's frames)")
        if not isinstance(node.ctx, ast.Load) and node.attr in FORBIDDEN_KEYWORDS:
            self.fail(node, f"setting .{node.attr} is not allowed (it reads or writes files)")
        if node.attr == "request":
            parent = self.names.parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr in REQUEST_METHODS):
                self.fail(node, "use .request only as page.request.get(...), .post(...) and the like")
        if not isinstance(node.ctx, ast.Load) and self._rooted_in_module(node):
            self.fail(node, "changing a module or what it holds is not allowed")
        if module == "os" and node.attr == "environ" and not self._reads_environ(node):
            # Environment variables reach Playwright's driver and Chromium (NODE_OPTIONS, CHROMIUM_FLAGS).
            self.fail(node, "os.environ may only be read, as os.environ[NAME] or os.environ.get(NAME)")
        if module == "sys" and node.attr == "argv" and not self._reads_argv(node):
            # parse_args() reads sys.argv: rewriting it would set --browser.
            self.fail(node, "sys.argv may only be read, as sys.argv[...] or len(sys.argv)")
        if module:
            return  # the module name itself was checked just now
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        # `case C(attr=x)` reads obj.attr without an Attribute node: `case object(__globals__=g)` would
        # reach any module unseen.
        if node.kwd_attrs:
            self.fail(
                node, f"a class pattern may not name attributes (case ...({node.kwd_attrs[0]}=...)); read obj.attr"
            )
        self.generic_visit(node)

    def _check_format(self, node: ast.Call, func: ast.Attribute) -> None:
        """str.format reads the attributes its fields name ('{0.__class__}'), unseen by the checks on
        attributes: the format string must be written out, and no field (nor a nested one in a format spec)
        may name a private attribute."""
        if not _is_str(func.value):
            self.fail(node, f".{func.attr}() needs its format string written out, as '...'.{func.attr}(...)")
        try:
            parts = [(f or "") + " " + (spec or "") for _, f, spec, _ in string.Formatter().parse(func.value.value)]
        except ValueError:
            return  # not a valid format string: Python refuses it when the script runs
        for part in parts:
            if "__" in part or any(name.startswith("_") for name in re.findall(r"\.([^.\[{}:! ]*)", part)):
                self.fail(node, f"the format field {part.strip()!r} reaches a private attribute")

    def _rooted_in_module(self, node: ast.expr) -> bool:
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        return isinstance(node, ast.Name) and self.names.module_of(node) is not None

    def _reads_environ(self, node: ast.Attribute) -> bool:
        parent = self.names.parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return isinstance(parent.ctx, ast.Load)
        if isinstance(parent, ast.Attribute) and parent.attr == "get":
            call = self.names.parents.get(parent)
            return isinstance(call, ast.Call) and call.func is parent
        if isinstance(parent, ast.Compare):
            return node in parent.comparators and all(isinstance(op, ast.In | ast.NotIn) for op in parent.ops)
        return False

    def _reads_argv(self, node: ast.Attribute) -> bool:
        parent = self.names.parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return isinstance(parent.ctx, ast.Load)
        return isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "len"

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and any(part in node.value for part in DANGEROUS_FLAG_PARTS):
            self.fail(node, f"the browser flag in {node.value[:60]!r} is not allowed (it makes Chromium run programs)")

    # --- annotations ----------------------------------------------------------------------------------

    def _check_annotation(self, annotation: ast.expr | None) -> None:
        # A string annotation is code that typing.get_type_hints and friends evaluate later, unchecked.
        if annotation is not None and not _plain_annotation(annotation):
            self.fail(annotation, "annotations may only be plain names such as str, Page or list[str]")

    def visit_arg(self, node: ast.arg) -> None:
        self._check_annotation(node.annotation)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._check_annotation(node.returns)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_annotation(node.annotation)
        self.generic_visit(node)

    # --- calls ----------------------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        for kw in node.keywords:
            if kw.arg is None:
                self.fail(node, "passing **keyword arguments is not allowed (they hide what is called)")
            if kw.arg == "path" and self._is_scratch_file(node, kw.value):
                continue
            if kw.arg in FORBIDDEN_KEYWORDS:
                why = "it writes or reads files, or changes how the browser starts or where its traffic goes"
                if kw.arg == "path":
                    why = "only screenshot(path=...) and pdf(path=...) may write, to a relative path such as 'shot.png'"
                self.fail(node, f"the argument {kw.arg}= is not allowed ({why})")
            if kw.arg == "args":
                self.launch.check_args(node, kw.value)
            if kw.arg == "executable_path":
                self.launch.check_executable_path(node, kw.value)
            if kw.arg == "dest" and not (isinstance(kw.value, ast.Constant) and kw.value.value != "browser"):
                self.fail(node, "dest= may only be a fixed name other than browser")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "set_defaults":
            if any(kw.arg == "browser" for kw in node.keywords):
                self.fail(node, "set_defaults(browser=...) is not allowed: the browser comes from QVL_BROWSER")
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            self.launch.check_add_argument(node)
        if self.names.is_member(func, "argparse", "ArgumentParser"):
            # Positional arguments reach fromfile_prefix_chars (an @file reader) and parents.
            if node.args or any(kw.arg not in PARSER_KEYWORDS for kw in node.keywords):
                self.fail(node, f"ArgumentParser() takes only these keyword arguments: {', '.join(PARSER_KEYWORDS)}")
        if isinstance(func, ast.Attribute) and func.attr == "start" and _attr_name(func.value) == "tracing":
            for kw in node.keywords:
                if kw.arg == "name" and not _is_plain_file_name(kw.value):
                    self.fail(node, "tracing.start(name=...) may only be a plain name without folders")
        if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
            self._check_format(node, func)
        if _is_print(func) and self._in_loop(node):
            self.fail(node, "printing inside a loop is not allowed (its output has no bound); print once after it")
        self.generic_visit(node)

    def _is_scratch_file(self, call: ast.Call, value: ast.expr) -> bool:
        """screenshot(path=...) or pdf(path=...) to a relative path inside the scratch folder."""
        return (
            isinstance(call.func, ast.Attribute)
            and call.func.attr in ("screenshot", "pdf")
            and _is_str(value)
            and _is_relative_inside(value.value)
        )

    def _saves_into_scratch(self, node: ast.Attribute) -> bool:
        """download.save_as('file.txt'): a download kept at a relative path inside the scratch folder."""
        call = self.names.parents.get(node)
        return (
            node.attr == "save_as"
            and isinstance(call, ast.Call)
            and call.func is node
            and len(call.args) == 1
            and not call.keywords
            and _is_str(call.args[0])
            and _is_relative_inside(call.args[0].value)
        )

    def _in_loop(self, node: ast.AST) -> bool:
        parent = self.names.parents.get(node)
        while parent is not None:
            if isinstance(parent, ast.While | ast.For | ast.comprehension | ast.ListComp | ast.GeneratorExp):
                return True
            parent = self.names.parents.get(parent)
        return False

    def visit_BinOp(self, node: ast.BinOp) -> None:
        # "x" * 10**9 builds (and then prints or sends) gigabytes from one line.
        if isinstance(node.op, ast.Mult | ast.Pow):
            for one, other in ((node.left, node.right), (node.right, node.left)):
                sequence = isinstance(one, ast.List | ast.Tuple | ast.JoinedStr) or (
                    isinstance(one, ast.Constant) and isinstance(one.value, str | bytes)
                )
                small = isinstance(other, ast.Constant) and isinstance(other.value, int) and other.value <= 10_000
                if isinstance(node.op, ast.Mult) and sequence and not small:
                    self.fail(node, "repeating a string or list is allowed only by a literal count up to 10000")
            if isinstance(node.op, ast.Pow) and not (
                isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) and node.right.value <= 64
            ):
                self.fail(node, "powers are allowed only with a literal exponent up to 64")
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.fail(node, "async code is not allowed; use Playwright's sync API")


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_relative_inside(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return bool(path) and not path.startswith(("/", "~")) and ":" not in path and ".." not in parts and "\0" not in path


def _is_plain_file_name(node: ast.expr) -> bool:
    return _is_str(node) and _is_relative_inside(node.value) and "/" not in node.value and "\\" not in node.value


def _attr_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ""


def _is_print(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "print") or (
        isinstance(func, ast.Attribute) and func.attr == "write"
    )


def _plain_annotation(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _plain_annotation(node.value)
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.Subscript):
        return _plain_annotation(node.value) and _plain_annotation(node.slice)
    if isinstance(node, ast.Tuple):
        return all(_plain_annotation(e) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _plain_annotation(node.left) and _plain_annotation(node.right)
    return False


def _allowed_list() -> str:
    return ", ".join(ALLOWED_MODULES)


def check_script(source: str) -> None:
    """Raise ScriptRejected (one sentence with the line) unless `source` passes the policy."""
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
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source.encode("utf-8")).readline)
    except SyntaxError as exc:
        raise ScriptRejected(exc.lineno or 0, f"the script is not valid Python ({exc.msg})") from None
    if encoding not in ("utf-8", "utf-8-sig"):
        # The script is saved as UTF-8, and Python decodes the file as the declaration says: under
        # `coding: utf-7`, '+AAo-' in a comment is a line break, so it would run code never checked here.
        raise ScriptRejected(1, f"a source encoding other than UTF-8 ({encoding}) is not allowed")
    if not any(isinstance(n, ast.ImportFrom) and n.module == "playwright.sync_api" for n in ast.walk(tree)):
        raise ScriptRejected(0, "The script must use Playwright's sync API (playwright.sync_api)")
    _Checker(Bindings(tree)).visit(tree)


def verdict(source: str) -> Verdict:
    """The policy's answer as a value, for callers that report rather than raise."""
    try:
        check_script(source)
    except ScriptRejected as exc:
        return Verdict(False, exc.reason, exc.line)
    return Verdict(True)
