"""The last check before an exported script is written: its syntax tree holds only what the exporter
means to write, whatever a recorded value contained.

The script must parse, and equal the template (`reference`, the template filled with neutral values)
statement by statement, except for

  - the module docstring (any string),
  - the values of the template's constants (`START_URL = ...`): plain literals only,
  - the body of `replay(page, origin)`, where each statement is a Playwright call, `page = ...`,
    `tabs = [page]`, `closing = page`, `with page.expect_popup() as popup:`, `with closing.expect_event(...):`,
    `try: ... except Error: ...`, `if not <Playwright call>: ...` or a bare `raise`, and each expression is
    built from literals, the names `page`, `popup`, `tabs`, `closing`, `origin`, calls of the Playwright
    methods below, `expect(...)`,
    `re.compile(...)`, `re.escape(...)`, `DIALOGS.expect(...)` / `DIALOGS.opened(...)` (a recorded dialog) and reads of
    `os.environ["QVL_SECRET_..."]`. No other name, attribute, subscript or operator.

`check_export` raises `UnsafeScript` (one sentence) otherwise, and the exporter writes nothing. Pure.
"""

from __future__ import annotations

import ast
import functools
import re

from qvl_agent.errors import InputError
from qvl_agent.secrets import ENV_PREFIX

__all__ = ["PLAYWRIGHT_ATTRS", "UnsafeScript", "check_export"]

# Everything the step compiler and the end-state checks call or read on a page, locator, mouse,
# keyboard, popup or `expect(...)` result.
PLAYWRIGHT_ATTRS = frozenset(
    {
        "get_by_role", "get_by_label", "get_by_placeholder", "get_by_test_id", "get_by_text", "locator", "filter",
        "click", "dblclick", "fill", "check", "uncheck", "select_option", "press", "press_sequentially",
        "hover", "drag_to", "mouse", "keyboard", "move", "wheel", "down", "up", "type", "expect_popup",
        "value", "bring_to_front", "first", "append", "to_have_url", "to_have_value", "to_have_values",
        "to_have_text", "to_be_checked", "not_to_be_checked", "to_be_visible", "to_be_focused",
        "expect_event", "is_closed", "wait_for_event", "to_have_count",
    }
)  # fmt: skip
_LINE_END = re.compile(rb"\r\n|\r|\n")
RECEIVERS = frozenset({"page", "popup", "tabs", "closing"})
VALUES = RECEIVERS | {"origin"}


class UnsafeScript(InputError):
    """The exported script holds code the exporter does not write."""


@functools.lru_cache(maxsize=4)
def _parsed_reference(reference: str) -> tuple[list[ast.stmt], list[bytes]]:
    ref = ast.parse(reference)
    return ref.body, _segments(reference, ref.body)


def _segments(source: str, nodes: list[ast.stmt]) -> list[bytes]:
    """Each statement's own text and its decorators' trees. Positions count lines the way the tokenizer
    does (only \r\n, \r and \n end one, unlike str.splitlines) and columns in UTF-8 bytes."""
    data = source.encode("utf-8", "surrogatepass")
    starts = [0] + [m.end() for m in _LINE_END.finditer(data)]
    out = []
    for node in nodes:
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        decorators = "".join(ast.dump(d) for d in getattr(node, "decorator_list", ()))
        out.append(data[begin:end] + b"\0" + decorators.encode())
    return out


def check_export(source: str, reference: str) -> None:
    """Raise UnsafeScript unless `source` is `reference` with only the allowed parts differing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        why = exc.__class__.__name__
        raise UnsafeScript(f"The exported script does not parse ({why}); nothing was written.") from None
    ref_body, ref_segments = _parsed_reference(reference)
    if len(tree.body) != len(ref_body):
        _refuse("its top level differs from the template")
    segments = _segments(source, tree.body)
    for i, (node, expected) in enumerate(zip(tree.body, ref_body, strict=True)):
        # The same statement text parses to the same tree: comparing text is comparing code, and cheap.
        if type(node) is type(expected) and segments[i] == ref_segments[i]:
            continue
        if i == 0 and _is_docstring(node) and _is_docstring(expected):
            continue
        if isinstance(expected, ast.FunctionDef) and expected.name == "replay":
            _check_replay(node, expected)
        elif isinstance(expected, ast.Assign) and isinstance(node, ast.Assign):
            if ast.dump(ast.Module(node.targets, [])) != ast.dump(ast.Module(expected.targets, [])):
                _refuse("a constant of the template was renamed")
            _literal(node.value)
        elif ast.dump(node) != ast.dump(expected):
            _refuse(f"line {getattr(node, 'lineno', '?')} is not the template's")


def _refuse(why: str):
    raise UnsafeScript(f"The exported script was not written: {why}.")


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _literal(node: ast.expr) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool | type(None)):
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return _literal(node.operand)
    if isinstance(node, ast.List | ast.Tuple):
        for item in node.elts:
            _literal(item)
        return
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                _refuse("a mapping is unpacked")
            _literal(key)
            _literal(value)
        return
    _refuse(f"{type(node).__name__} where a literal belongs")


def _check_replay(node: ast.stmt, expected: ast.FunctionDef) -> None:
    if not isinstance(node, ast.FunctionDef) or node.name != "replay":
        _refuse("replay() is missing")
    if ast.dump(node.args) != ast.dump(expected.args) or node.decorator_list or node.returns:
        _refuse("replay() has another signature")
    _statements(node.body)


def _statement(node: ast.stmt) -> None:
    if isinstance(node, ast.Pass):
        return
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return _expr(node.value)
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in ("page", "tabs", "closing"):
            return _expr(node.value)
    if isinstance(node, ast.With) and len(node.items) == 1:
        item = node.items[0]
        call = item.context_expr
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and _with_target(call.func.attr, item):
            _expr(call)
            return _statements(node.body)
    if isinstance(node, ast.Try) and not (node.orelse or node.finalbody) and len(node.handlers) == 1:
        handler = node.handlers[0]  # a tab that closes itself: `except Error:` around the closing action
        if handler.name is None and isinstance(handler.type, ast.Name) and handler.type.id == "Error":
            _statements(node.body)
            return _statements(handler.body)
    if isinstance(node, ast.If) and not node.orelse:
        test = node.test
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call):
            _expr(test.operand)
            return _statements(node.body)
    if isinstance(node, ast.Raise) and node.exc is None and node.cause is None:
        return
    _refuse(f"replay() holds a {type(node).__name__} statement it never writes")


def _statements(nodes: list[ast.stmt]) -> None:
    for inner in nodes:
        _statement(inner)


def _with_target(method: str, item: ast.withitem) -> bool:
    """`with page.expect_popup() as popup:` or `with closing.expect_event(...):`, nothing else."""
    named = item.optional_vars
    if method == "expect_popup":
        return isinstance(named, ast.Name) and named.id == "popup"
    return method == "expect_event" and named is None


def _expr(node: ast.expr) -> None:
    if isinstance(node, ast.Constant | ast.UnaryOp | ast.Dict):
        return _literal(node)
    if isinstance(node, ast.List | ast.Tuple):
        for item in node.elts:
            _expr(item)
        return
    if isinstance(node, ast.Name):
        if node.id in VALUES:
            return
        _refuse(f"replay() uses the name {node.id!r}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        _expr(node.left)
        return _expr(node.right)
    if isinstance(node, ast.Subscript):
        return _subscript(node)
    if isinstance(node, ast.Attribute):
        if node.attr not in PLAYWRIGHT_ATTRS:
            _refuse(f"replay() reads the attribute {node.attr!r}")
        return _receiver(node.value)
    if isinstance(node, ast.Call):
        return _call(node)
    _refuse(f"replay() holds a {type(node).__name__} expression it never writes")


def _receiver(node: ast.expr) -> None:
    """What a Playwright attribute is read on: a page/popup/tabs name, or the result of an allowed call."""
    if isinstance(node, ast.Name) and node.id in RECEIVERS:
        return
    if isinstance(node, ast.Call | ast.Attribute) or (
        isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "tabs"
    ):
        return _expr(node)
    _refuse(f"a Playwright method is called on a {type(node).__name__}")


def _subscript(node: ast.Subscript) -> None:
    key = node.slice
    if isinstance(node.value, ast.Name) and node.value.id == "tabs":
        if isinstance(key, ast.Constant) and type(key.value) is int:
            return
    elif (
        isinstance(node.value, ast.Attribute)
        and node.value.attr == "environ"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "os"
        and isinstance(key, ast.Constant)
        and isinstance(key.value, str)
        and key.value.startswith(ENV_PREFIX)
    ):
        return
    _refuse("replay() reads an item other than a tab or a secret")


def _call(node: ast.Call) -> None:
    func = node.func
    for arg in node.args:
        if isinstance(arg, ast.Starred):
            _refuse("a call unpacks its arguments")
        _expr(arg)
    for keyword in node.keywords:
        if keyword.arg is None:
            _refuse("a call unpacks its keywords")
        _expr(keyword.value)
    if isinstance(func, ast.Name) and func.id == "expect" and len(node.args) == 1 and not node.keywords:
        return
    if (
        isinstance(func, ast.Attribute)
        and func.attr in ("compile", "escape")
        and isinstance(func.value, ast.Name)
        and func.value.id == "re"
        and len(node.args) == 1
        and not node.keywords
    ):
        return
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "DIALOGS"
        and (func.attr, len(node.args)) in (("expect", 3), ("expect", 4), ("opened", 2))
        and not node.keywords
    ):
        return  # a recorded dialog (or the wait for one); its arguments were checked above
    if isinstance(func, ast.Attribute) and func.attr in PLAYWRIGHT_ATTRS:
        return _receiver(func.value)
    _refuse("replay() calls something other than Playwright")
