"""Secrets in an exported script: every string literal holding a `{{NAME}}` placeholder becomes an
expression reading `os.environ["QVL_SECRET_NAME"]`, so the script types the secret at replay time and its
value never sits in the file. Works on the compiled source's tokens, whatever step compiled the literal."""

from __future__ import annotations

import ast
import io
import tokenize

from qvl_agent.secrets import PLACEHOLDER, env_name


def read_from_environment(source: str) -> str:
    """`source` with each placeholder-holding string literal replaced by env reads (and plain parts)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    for tok in tokens:
        if tok.type != tokenize.STRING:
            continue
        try:
            value = ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if not isinstance(value, str) or not PLACEHOLDER.search(value):
            continue
        start = offsets[tok.start[0] - 1] + tok.start[1]
        end = offsets[tok.end[0] - 1] + tok.end[1]
        edits.append((start, end, _expression(value)))
    for start, end, text in reversed(edits):
        source = source[:start] + text + source[end:]
    return source


def _expression(value: str) -> str:
    parts: list[str] = []
    at = 0
    for match in PLACEHOLDER.finditer(value):
        if match.start() > at:
            parts.append(repr(value[at : match.start()]))
        parts.append(f'os.environ["{env_name(match.group(1))}"]')
        at = match.end()
    if at < len(value):
        parts.append(repr(value[at:]))
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]
