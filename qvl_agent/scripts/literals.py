"""The one place an exported script's literals are written: every value recorded in a run (typed text,
labels, keys, URLs, numbers) becomes Python source here and nowhere else, so no run data is ever pasted
into code as text.

  - `lit(value)` writes a str, number, bool, None, or a list/tuple/dict of them as a Python expression.
    A string is double-quoted, with `"` and `\\` escaped and every character that `str.isprintable`
    rejects written as its `repr` escape (line and paragraph separators, NEL, form feed, control and
    format characters, lone surrogates), so the literal is one physical line for any tool that splits
    lines, and the source always encodes as UTF-8. A `{{NAME}}` in a value is text like any other: a
    page, a label or a typed word can hold those braces, and none of them becomes a read of the person's
    variables.
  - `typed_code(segments)` writes what one `type` action typed, from the run's own record of it: literal
    text, and for each declared secret the model typed by its placeholder, a read of
    `os.environ["QVL_SECRET_NAME"]` (the parts concatenated), so the script types the secret at replay
    time and its value never sits in the file. Nothing here searches text for values or placeholders.
  - `comment_text` and `docstring_text` put run data into a `#` comment or the script's docstring, with
    the same escapes (and, for the docstring, no quote or backslash that could end it).

Pure: standard library only. `UnsafeValue` is raised for anything else (an object, a number too large to
write, NaN), which a trace written by the executor never holds.
"""

from __future__ import annotations

import ast
import math

from qvl_agent.errors import InputError
from qvl_agent.secrets import ENV_PREFIX, SECRET_NAME, env_name

__all__ = [
    "UnsafeValue",
    "comment_text",
    "docstring_text",
    "env_read",
    "lit",
    "read_secrets",
    "secrets_read_in",
    "string_literal",
    "typed_code",
]

MAX_ABS_NUMBER = 10**15  # far beyond any CSS pixel, count or tab index; keeps repr short and exact


class UnsafeValue(InputError):
    """A recorded value the exporter will not write into a script."""


def _escape(ch: str) -> str:
    return repr(ch)[1:-1]  # only ever called for a non-printable character: never a quote


def string_literal(text: str) -> str:
    """`text` as a double-quoted Python literal on one line (no placeholder handling)."""
    if not isinstance(text, str):
        raise UnsafeValue(f"A recorded value is not text: {type(text).__name__}.")
    if text.isprintable():  # the common case, in C: only the quote and the backslash need escaping
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(_escape(ch))  # \n, \x0c, \x85, \u2028, \ud800, \u202e ...
    return '"' + "".join(out) + '"'


def env_read(name: str) -> str:
    """The expression reading secret `name` at replay time (`name` a secret's name)."""
    return f"os.environ[{string_literal(env_name(name))}]"


def typed_code(segments: list) -> str:
    """The expression for typed text recorded as segments: ["text", TEXT] typed as it is, ["secret", NAME]
    read from the secret's variable at replay time (`secrets.Secrets.segments` records them)."""
    parts: list[str] = []
    for kind, value in segments:
        if kind == "secret":
            if not isinstance(value, str) or not SECRET_NAME.fullmatch(value):
                raise UnsafeValue("A recorded secret name is not a name.")
            parts.append(env_read(value))
        elif kind == "text":
            if value:
                parts.append(string_literal(value))
        else:
            raise UnsafeValue(f"A recorded piece of typed text has an unknown kind: {comment_text(kind)}.")
    if not parts:
        return string_literal("")
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]


def _number(value: int | float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise UnsafeValue(f"A recorded number is not finite: {value!r}.")
    if abs(value) > MAX_ABS_NUMBER:
        raise UnsafeValue("A recorded number is out of range.")
    return repr(value)


def lit(value) -> str:
    """Python source for `value` (see the module docstring)."""
    if isinstance(value, str):
        return string_literal(value)
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, list | tuple):
        items = ", ".join(lit(v) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise UnsafeValue("A recorded mapping has a key that is not text.")
        return "{" + ", ".join(f"{string_literal(k)}: {lit(v)}" for k, v in value.items()) + "}"
    raise UnsafeValue(f"A recorded value cannot be written into a script: {type(value).__name__}.")


def comment_text(text) -> str:
    """`text` on one line, safe for a `#` comment or a terminal: every non-printable character escaped."""
    text = str(text)
    if text.isprintable():  # the common case, in C
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def docstring_text(text: str) -> str:
    """`text` on one line inside a triple-quoted docstring: escapes kept as text, no quote or backslash
    that could end the string or start an escape, placeholders left as they are."""
    one_line = comment_text(" ".join(str(text).split()))
    return one_line.replace("\\", "\\\\").replace('"', '\\"')


def read_secrets(source: str) -> list[str]:
    """The `QVL_SECRET_*` variables `source` reads as `os.environ["QVL_SECRET_X"]` (what `env_read` writes),
    sorted; none when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return secrets_read_in(tree)


def secrets_read_in(tree: ast.AST) -> list[str]:
    """`read_secrets` of a script already parsed."""
    # Every node, as `ast.walk` visits them (in another order), with a stack and direct attribute reads
    # instead of its generators: about twice as fast, and an export walks a script of hundreds of steps.
    found = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith(ENV_PREFIX):
                found.add(key.value)
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        stack.append(item)
            elif isinstance(value, ast.AST):
                stack.append(value)
    return sorted(found)
