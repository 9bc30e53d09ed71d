"""Writing `SCRIPT.healed.py`: the script with each healed step's locator replaced, built as syntax.

For each heal the call that failed is found in the script's syntax tree by where it ends (the position the
hook read from the running frame) and by its method's name; its locator (the receiver of `.click(...)`,
or the argument of `expect(...)`) is replaced by a new node built from the healed locator dict, on the
same page expression the old locator started from (`page`, `tabs[1]`, ...). Every text in it is an
`ast.Constant`, so a name or selector from the page can only ever be a string. A covering layer's heal
inserts, before the statement that was blocked, `page.add_locator_handler(<its button>, lambda found:
found.click())`: Playwright then dismisses the layer whenever it shows, so the healed script also works
in a fresh browser where it shows first, and where it never shows.

The text is produced by writing each new node (as the exporter writes it: `steps.python_locator`)
where the old node stood, so comments (the
step and intent lines) and the rest of the layout stay as they were; then the whole result is parsed again
and must equal, node for node, the original tree with exactly these replacements made in the tree itself.
Anything else (a position that does not line up, an odd line ending) is refused, never written.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
from dataclasses import dataclass

from qvl_agent.errors import QvlError
from qvl_agent.playwright import locate
from qvl_agent.scripts import intent
from qvl_agent.scripts.export.steps import python_locator

FACTORIES = {"locator", "get_by_role", "get_by_label", "get_by_placeholder", "get_by_test_id", "get_by_text",
             "get_by_alt_text", "get_by_title", "frame_locator", "nth", "first", "last", "filter"}  # fmt: skip
POINT_KEYWORDS = ("position", "source_position")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


class RewriteError(QvlError):
    """The healed script could not be built faithfully; nothing was written."""


@dataclass(frozen=True)
class Edit:
    """One healed call: where it ends, which method, its new locator; `cover` inserts a handler instead."""

    end_line: int
    end_col: int
    method: str
    locator: dict
    cover: bool = False


def _calls(locator: dict) -> list:
    try:
        return locate.chain(locator)
    except (KeyError, TypeError, ValueError):
        raise RewriteError(f"A {locator.get('kind')} locator cannot be written into a script.") from None


def locator_node(page: ast.expr, locator: dict) -> ast.expr:
    """`page.get_by_role("button", name="Save", exact=True)` and the like, as a node."""

    def build(calls: list) -> ast.expr:
        node = copy.deepcopy(page)
        for method, args, keywords in calls:
            node = ast.Call(
                ast.Attribute(node, method, ast.Load()),
                [value(a) for a in args],
                [ast.keyword(k, value(v)) for k, v in keywords.items()],
            )
        return node

    def value(v) -> ast.expr:
        return build(v) if isinstance(v, list) else ast.Constant(v)

    return build(_calls(locator))


def locator_code(page: ast.expr, locator: dict) -> str:
    """The same as source, its strings written by the exporter's own literal builder (double quotes, every
    unprintable character escaped), as the rest of an exported script."""
    _calls(locator)  # the same refusal as locator_node
    return python_locator(locator, ast.unparse(page)) or ""


def _call_at(tree: ast.AST, edit: Edit) -> ast.Call | None:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == edit.method
            and (node.end_lineno, node.end_col_offset) == (edit.end_line, edit.end_col)
        ):
            return node
    return None


def _target(call: ast.Call) -> tuple[ast.AST, str, int | None, ast.expr]:
    """(parent, field, index, node) of the failing call's locator: the receiver of an action, or the
    argument of `expect(...)` for an assertion."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "expect":
        if len(receiver.args) != 1:
            raise RewriteError("An expect() call with other than one argument cannot be healed in place.")
        return receiver, "args", 0, receiver.args[0]
    return call.func, "value", None, receiver


def _page_of(node: ast.expr) -> ast.expr | None:
    """The page expression a locator chain starts from: the receiver of its first locator-making call."""
    page = None
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in FACTORIES:
                page = node.func.value
            node = node.func.value
        elif isinstance(node, ast.Attribute):
            if node.attr in FACTORIES:
                page = node.value
            node = node.value
        else:
            return page


def _statement_of(tree: ast.AST, call: ast.Call) -> tuple[list, ast.stmt]:
    """The innermost statement holding `call`, and the body it is in."""
    best: tuple[list, ast.stmt] | None = None
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list):
                continue
            for stmt in body:
                if isinstance(stmt, ast.stmt) and any(n is call for n in ast.walk(stmt)):
                    if best is None or any(n is stmt for n in ast.walk(best[1])):
                        best = (body, stmt)
    if best is None:
        raise RewriteError("The healed call is in no statement.")
    return best


def _lines(source: str) -> list[str]:
    return _LINE.findall(source)


def _index(lines: list[str], starts: list[int], line: int, col: int) -> int:
    """The string index of (line, UTF-8 byte column) as the parser counts them."""
    text = lines[line - 1].encode("utf-8")[:col].decode("utf-8")
    return starts[line - 1] + len(text)


def healed_source(source: str, edits: list[Edit]) -> str:
    """The script with `edits` made; RewriteError when one cannot be made faithfully."""
    tree = ast.parse(source)
    expected = ast.parse(source)  # changed in place, node for node, to check the text against
    pairs = {id(a): b for a, b in zip(ast.walk(tree), ast.walk(expected), strict=True)}
    lines = _lines(source)
    if "".join(lines) != source:
        raise RewriteError("The script's lines could not be told apart.")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    text_edits: list[tuple[int, int, str]] = []
    done: set[tuple[int, int, str, bool]] = set()
    inserted: set[tuple[int, str]] = set()
    intents_done: set[int] = set()
    for edit in edits:
        key = (edit.end_line, edit.end_col, edit.method, edit.cover)
        if key in done:
            continue
        done.add(key)
        call = _call_at(tree, edit)
        if call is None:
            raise RewriteError(f"No call to .{edit.method}() ends at line {edit.end_line} of the script.")
        parent, field, index, node = _target(call)
        page = _page_of(node)
        if page is None:
            raise RewriteError(
                f"Line {node.lineno} keeps its locator in a variable, so the healed locator cannot be written there."
            )
        new, code = locator_node(page, edit.locator), locator_code(page, edit.locator)
        if not edit.cover:
            _, stmt = _statement_of(tree, call)
            text_edits += _healed_intent(lines, starts, stmt.lineno, edit.locator, intents_done)
        if edit.cover:
            body, stmt = _statement_of(tree, call)
            click = ast.Call(ast.Attribute(ast.Name("found", ast.Load()), "click", ast.Load()), [], [])
            handler = ast.Expr(
                ast.Call(
                    ast.Attribute(copy.deepcopy(page), "add_locator_handler", ast.Load()),
                    [new, ast.Lambda(_one_arg("found"), click)],
                    [],
                )
            )
            code = f"{ast.unparse(page)}.add_locator_handler({code}, lambda found: found.click())"
            if (id(stmt), code) in inserted:
                continue
            inserted.add((id(stmt), code))
            line = lines[stmt.lineno - 1]
            indent = line.encode("utf-8")[: stmt.col_offset].decode("utf-8")
            if indent.strip():
                raise RewriteError(f"Line {stmt.lineno} holds more than one statement; nothing was inserted there.")
            ending = line[len(line.rstrip("\r\n")) :] or "\n"
            at = starts[stmt.lineno - 1]
            text_edits.append((at, at, indent + code + ending))
            twin_body = _twin_body(tree, expected, body, pairs)
            twin_body.insert(twin_body.index(pairs[id(stmt)]), copy.deepcopy(handler))
            continue
        twin = pairs[id(parent)]
        if index is None:
            setattr(twin, field, copy.deepcopy(new))
        else:
            getattr(twin, field)[index] = copy.deepcopy(new)
        dropped = [k for k in call.keywords if k.arg in POINT_KEYWORDS] if index is None else []
        if dropped:
            # A point inside the old element means nothing on the new one: the healed step acts at its centre,
            # as the heal itself did. The call is written anew from its other arguments' own text.
            kept = [a for a in call.args] + [k for k in call.keywords if k.arg not in POINT_KEYWORDS]
            pieces = [ast.get_source_segment(source, a) for a in kept]
            if any(p is None for p in pieces):
                raise RewriteError(f"The call on line {call.lineno} could not be rewritten.")
            code = f"{code}.{edit.method}({', '.join(pieces)})"  # type: ignore[arg-type]
            pairs[id(call)].keywords = [k for k in pairs[id(call)].keywords if k.arg not in POINT_KEYWORDS]
            node = call
        start = _index(lines, starts, node.lineno, node.col_offset)
        end = _index(lines, starts, node.end_lineno, node.end_col_offset)
        text_edits.append((start, end, code))
    result = source
    for start, end, text in sorted(text_edits, key=lambda e: (e[0], e[1]), reverse=True):
        result = result[:start] + text + result[end:]
    try:
        rebuilt = ast.parse(result)
    except SyntaxError:
        raise RewriteError("The healed script did not parse; nothing was written.") from None
    if ast.dump(rebuilt) != ast.dump(expected):
        raise RewriteError("The healed script's syntax differs from the planned change; nothing was written.")
    return result


def _healed_intent(lines: list[str], starts: list[int], line: int, locator: dict, done: set[int]) -> list:
    """The text edit that rewrites the `# intent:` comment above the statement on `line` (only code between
    them) to say what the step's element is now: its role, name, item and locator. A second heal then asks
    for the element as the page shows it now, not as it was recorded. A comment changes no syntax."""
    at = line - 2
    while at >= 0 and lines[at].strip() and not lines[at].lstrip().startswith("#"):
        at -= 1  # code of the same step (its check, or a statement spanning lines)
    if at < 0 or at in done or not lines[at].lstrip().startswith(intent.PREFIX):
        return []
    found = intent.parse(lines[at])
    if found is None:
        return []
    done.add(at)
    found = {k: v for k, v in found.items() if k not in ("name", "item", "by_position", "locator")}
    own = locator.get("inner", {}) if locator.get("kind") == "within" else locator
    if own.get("kind") == "role":
        found.update(role=own["role"], name=own["name"])
    elif own.get("kind") in ("label", "placeholder", "text"):
        found["name"] = own["text"]
    if locator.get("kind") == "within":
        found["item"] = locator["has_text"]
    elif locator.get("kind") == "css":
        found["by_position"] = True
    found["locator"] = locator
    text = lines[at].rstrip("\r\n")
    indent = text[: len(text) - len(text.lstrip())]
    return [(starts[at], starts[at] + len(text), indent + intent.comment(found))]


def _one_arg(name: str) -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[ast.arg(name)], kwonlyargs=[], kw_defaults=[], defaults=[])


def _twin_body(tree: ast.AST, expected: ast.AST, body: list, pairs: dict) -> list:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            if getattr(node, name, None) is body:
                return getattr(pairs[id(node)], name)
    raise RewriteError("The healed statement's block was not found.")


def code_at(source: str, end_line: int, end_col: int, method: str) -> str:
    """The failing call's locator as the script wrote it (for the heal list and the report)."""
    try:
        tree = ast.parse(source)
        call = _call_at(tree, Edit(end_line, end_col, method, {}))
        return ast.get_source_segment(source, _target(call)[3]) or "" if call is not None else ""
    except (SyntaxError, RewriteError):
        return ""


def unified_diff(source: str, healed: str, old_name: str, new_name: str) -> str:
    return "".join(difflib.unified_diff(_lines(source), _lines(healed), old_name, new_name))
