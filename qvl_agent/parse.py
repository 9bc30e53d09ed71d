"""Model text -> actions.

`parse_actions` is the one place Qwen3-VL's text becomes typed actions. It takes real model output:
`<tool_call>{...}</tool_call>` blocks (the closing tag may be missing), ```json fences, "Thought: ...
Action: ..." preambles, `<think>` blocks, several calls in one reply (returned in order), and small JSON
slips whose meaning is unambiguous: trailing commas, single quotes, Python literals, unquoted keys, a
missing or an extra closing brace. Anything else raises `ParseError` with one sentence naming what was
wrong; the agent shows that sentence to the model.

A pure function of the text: no I/O, and nothing imported beyond the standard library, the action types,
the error tree and the grid size from `image.py` (where coordinates become pixels). `code_blocks` is the
one ``` fence reader; `reply_words` is what the model said besides its calls (its reason, shown to the
person).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Iterator

from qvl_agent import actions as A
from qvl_agent.errors import ParseError
from qvl_agent.image import GRID

TOOL_NAME = "computer_use"
MAX_WAIT_S = 60.0
_ALIASES = {"click": "left_click"}

_THINK = re.compile(r"<think>.*?</think>", re.S)
_TOOL_OPEN = re.compile(r"<tool_call>", re.I)
_TOOL_CLOSE = re.compile(r"</tool_call>", re.I)
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_NUMBER = r"-?\d+(?:\.\d+)?"
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S | re.I)


def reply_words(reply: str) -> str:
    """What the model said around its tool calls (why it acts, "Thought: ..."), stripped; "" when nothing."""
    return _TOOL_CALL_BLOCK.sub("", _THINK.sub("", reply)).strip()


# --- finding the calls in a reply ---------------------------------------------------------------------


def code_blocks(text: str, languages: tuple[str, ...] | None = None) -> list[str]:
    """The bodies of the ``` fenced blocks in `text`, in order (a block left open runs to the end).
    With `languages`, only blocks tagged with one of them ("" for an untagged block), in any case."""
    return [
        body
        for tag, body in _FENCE.findall(text)
        if languages is None or tag.lower() in languages
    ]  # fmt: skip


def _scan(text: str, may_open: Callable[[], bool] = lambda: True) -> Iterator[tuple[int, str, str]]:
    """(index, character, where) for each character of `text`: where is "code", "string" (an opening
    quote or a string's content, backslash escapes honoured) or "close" (the quote that ends a string).
    A quote opens a string only when `may_open()` says so at that point (the caller may track nesting
    while it iterates)."""
    quote = escape = False
    for i, ch in enumerate(text):
        if quote:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                quote = False
                yield i, ch, "close"
                continue
            yield i, ch, "string"
        elif ch == '"' and may_open():
            quote = True
            yield i, ch, "string"
        else:
            yield i, ch, "code"


def _tool_call_blobs(text: str) -> list[str]:
    """The text inside each <tool_call>; a call runs to its closing tag, the next call, or the end."""
    opens = list(_TOOL_OPEN.finditer(text))
    blobs = []
    for i, m in enumerate(opens):
        end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
        chunk = text[m.end() : end]
        close = _TOOL_CLOSE.search(chunk)
        blobs.append(chunk[: close.start()] if close else chunk)
    return blobs


def _bare_objects(text: str) -> list[str]:
    """Top-level {...} spans in free text that look like a call (they mention "action" or "name").
    Quotes count only inside an object: prose around it may hold a stray one."""
    spans, depth, start = [], 0, -1
    for i, ch, where in _scan(text, may_open=lambda: depth > 0):  # noqa: B023 (the depth of the moment)
        if where != "code":
            continue
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    if depth and start >= 0:
        spans.append(text[start:])  # an object cut off at the end of the reply
    return [s for s in spans if re.search(r"""["']?(action|name)["']?\s*:""", s)]


def _candidates(text: str) -> list[str]:
    if _TOOL_OPEN.search(text):
        return _tool_call_blobs(text)
    fences = [body for body in code_blocks(text) if "{" in body]
    if fences:
        return fences
    return _bare_objects(text)


# --- lenient JSON -------------------------------------------------------------------------------------


def _balance(blob: str) -> str:
    """Close brackets left open at the end and drop surplus closers; strings must be complete."""
    stack, out, where = [], [], "code"
    for _, ch, where in _scan(blob):
        if where == "code" and ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif where == "code" and ch in "}]":
            if not stack:
                continue  # a surplus closer, as in `...}}}` with one brace too many
            if stack[-1] != ch:
                return blob  # mismatched brackets: not a slip we can undo safely
            stack.pop()
        out.append(ch)
    if where == "string":
        return blob
    return "".join(out).rstrip().rstrip(",") + "".join(reversed(stack))


def _outside_strings(blob: str, fix: Callable[[str], str]) -> str:
    """Apply `fix` to the parts of `blob` between double-quoted strings, never inside one."""
    parts: list[tuple[bool, list[str]]] = []
    for _, ch, where in _scan(blob):
        code = where == "code"
        if not parts or parts[-1][0] != code:
            parts.append((code, []))
        parts[-1][1].append(ch)
    return "".join(fix("".join(chars)) if code else "".join(chars) for code, chars in parts)


def _repairs(blob: str):
    yield blob
    fixed = _outside_strings(blob, lambda s: re.sub(r",\s*([}\]])", r"\1", s))
    yield fixed  # trailing commas
    fixed = _outside_strings(fixed, lambda s: re.sub(r"([{,]\s*)([A-Za-z_]\w*)(\s*):", r'\1"\2"\3:', s))
    yield fixed  # unquoted keys
    yield _balance(fixed)


def _load_json(blob: str, where: str):
    blob = blob.strip()
    if blob.startswith("```"):
        blob = "".join(code_blocks(blob)[:1]).strip()
    if not blob:
        raise ParseError(f"{where} is empty; write the call as a JSON object inside <tool_call></tool_call>.")
    first_error = ""
    for attempt in _repairs(blob):
        try:
            value, end = json.JSONDecoder().raw_decode(attempt)
        except json.JSONDecodeError as exc:
            first_error = first_error or f"{exc.msg} at character {exc.pos}"
            continue
        except RecursionError:  # hostile nesting such as 100,000 "["
            first_error = first_error or "nested too deeply"
            continue
        except ValueError:  # Python refuses integers of more than 4,300 digits
            first_error = first_error or "a number has too many digits"
            continue
        if attempt[end:].strip(" \t\r\n}]"):
            first_error = first_error or f"Extra data at character {end}"
            continue
        return value
    try:  # single quotes, True/False/None: a Python literal is unambiguous too
        value = ast.literal_eval(_balance(blob))
        if isinstance(value, dict | list):
            return value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    snippet = blob if len(blob) <= 80 else blob[:77] + "..."
    raise ParseError(f"{where} is not valid JSON ({first_error}): {snippet}")


# --- arguments -> actions -----------------------------------------------------------------------------


def _number(value, what: str) -> float:
    if isinstance(value, bool):
        raise ParseError(f"{what} must be a number, not {value!r}.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ParseError(f"{what} must be a number, not {_shown(value)}.") from None
    except OverflowError:  # an integer of hundreds of digits has no float
        number = math.inf
    if not math.isfinite(number):
        raise ParseError(f"{what} must be a finite number, not {_shown(value)}.")
    return number


def _shown(value) -> str:
    """A value for a message: never the whole of a number of hundreds of digits (Python refuses to print
    one of more than 4,300 with a ValueError of its own)."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _point(value, kind: str, name: str = "coordinate") -> tuple[float, float]:
    if isinstance(value, str):
        nums = re.findall(_NUMBER, value)
        if len(nums) == 2 and re.fullmatch(rf"\s*[\[(]?\s*{_NUMBER}\s*,\s*{_NUMBER}\s*[\])]?\s*", value):
            value = nums
    if isinstance(value, dict) and {"x", "y"} <= set(value):
        value = [value["x"], value["y"]]
    if not isinstance(value, list | tuple) or len(value) != 2:
        got = f"{len(value)} numbers" if isinstance(value, list | tuple) else repr(value)
        raise ParseError(f'{kind} needs "{name}": [x, y] with two numbers from 0 to {GRID}, got {got}.')
    return _number(value[0], f"{kind} {name} x"), _number(value[1], f"{kind} {name} y")


def _keys(args: dict) -> tuple[str, ...]:
    value = args.get("keys", args.get("key"))
    if isinstance(value, str):
        value = [part for part in re.split(r"\s*\+\s*", value.strip()) if part] if value.strip() != "+" else ["+"]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(k, str) and k for k in value):
        raise ParseError('key needs "keys": a list of key names such as ["ctrl", "c"] or ["enter"].')
    return tuple(k.strip().lower() if len(k.strip()) > 1 else k for k in value)


def _text(args: dict, kind: str) -> str:
    value = args.get("text")
    if not isinstance(value, str):
        raise ParseError(f'{kind} needs "text": a string.')
    return value


def action_from_arguments(args: dict) -> A.Action:
    """One computer_use `arguments` object -> an action, or ParseError naming what is missing."""
    try:
        json.dumps(args, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        # A JSON escape like \ud800 alone decodes to a lone surrogate: no keyboard types it, and printing it
        # or saving it as UTF-8 (the final answer, an exported script) would fail.
        raise ParseError("The call holds a lone surrogate escape such as \\ud800, which is no character.") from None
    kind = args.get("action")
    if not isinstance(kind, str) or not kind.strip():
        raise ParseError(f'The call has no "action"; use one of: {", ".join(A.KINDS)}.')
    kind = _ALIASES.get(kind.strip().lower(), kind.strip().lower())
    if kind not in A.KINDS:
        raise ParseError(f'Unknown action "{kind}"; use one of: {", ".join(A.KINDS)}.')
    cls = A.KINDS[kind]
    if cls in A.POINTER_ACTIONS:
        if "coordinate" not in args:
            raise ParseError(f'{kind} needs "coordinate": [x, y] with two numbers from 0 to {GRID}.')
        return cls(*_point(args["coordinate"], kind))
    if cls is A.LeftClickDrag:
        if "coordinate" not in args:
            raise ParseError(f'left_click_drag needs "coordinate": [x, y], the point to drag to (0 to {GRID}).')
        x, y = _point(args["coordinate"], kind)
        start = args.get("start_coordinate")
        if start is None:
            return A.LeftClickDrag(x, y)
        sx, sy = _point(start, kind, "start_coordinate")
        return A.LeftClickDrag(x, y, sx, sy)
    if cls is A.Key:
        return A.Key(_keys(args))
    if cls is A.Type:
        return A.Type(_text(args, kind))
    if cls is A.Answer:
        return A.Answer(_text(args, kind))
    if cls is A.CallUser:
        return A.CallUser(_text(args, kind))
    if cls in (A.Scroll, A.HScroll):
        if "pixels" not in args:
            raise ParseError(f'{kind} needs "pixels": a number (positive scrolls up or right).')
        pixels = _number(args["pixels"], f"{kind} pixels")
        if "coordinate" in args and args["coordinate"] is not None:
            return cls(pixels, *_point(args["coordinate"], kind))
        return cls(pixels)
    if cls is A.HandleDialog:
        return _handle_dialog(args)
    if cls is A.Wait:
        if "time" not in args:
            raise ParseError('wait needs "time": the seconds to wait.')
        seconds = _number(args["time"], "wait time")
        if not 0 <= seconds <= MAX_WAIT_S:
            raise ParseError(f"wait time must be between 0 and {MAX_WAIT_S:g} seconds, not {seconds:g}.")
        return A.Wait(seconds)
    status = args.get("status")
    status = status.strip().lower() if isinstance(status, str) else status
    if status not in ("success", "failure"):
        raise ParseError(f'terminate needs "status": "success" or "failure", not {status!r}.')
    return A.Terminate(status)


def _handle_dialog(args: dict) -> A.HandleDialog:
    accept = args.get("accept")
    if isinstance(accept, str) and accept.strip().lower() in ("true", "false"):
        accept = accept.strip().lower() == "true"
    if not isinstance(accept, bool):
        raise ParseError(f'handle_dialog needs "accept": true (OK) or false (Cancel), not {_shown(accept)}.')
    text = args.get("text", args.get("promptText"))
    if text is not None and not isinstance(text, str):
        raise ParseError('handle_dialog\'s "text" (what a prompt() gets) must be a string.')
    return A.HandleDialog(accept, text)


def _arguments(call, where: str) -> dict:
    """Unwrap {"name", "arguments"} (arguments may be a JSON string), OpenAI's {"function": ...}, or a
    bare arguments object."""
    if not isinstance(call, dict):
        raise ParseError(f'{where} must be a JSON object like {{"name": "{TOOL_NAME}", "arguments": {{...}}}}.')
    if isinstance(call.get("function"), dict):
        call = call["function"]
    if "arguments" in call or "name" in call:
        name = call.get("name")
        if name is not None and name != TOOL_NAME:
            raise ParseError(f'{where} calls an unknown tool "{name}"; the only tool is "{TOOL_NAME}".')
        args = call.get("arguments", call.get("parameters"))
        if isinstance(args, str):
            args = _load_json(args, f"The arguments of {where.lower()}")
        if not isinstance(args, dict):
            raise ParseError(f'{where} needs "arguments": an object with an "action".')
        return args
    return call


def parse_actions(text: str) -> list[A.Action]:
    """Every computer_use call in a model reply, in order. Raises ParseError when there is none, or when
    any call is broken: a partly understood reply is never half executed."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError("The reply is empty; answer with a computer_use call inside <tool_call></tool_call>.")
    body = _THINK.sub("", text)
    blobs = _candidates(body)
    if not blobs:
        snippet = " ".join(body.split())
        snippet = snippet if len(snippet) <= 80 else snippet[:77] + "..."
        raise ParseError(
            f'The reply has no tool call: expected <tool_call>{{"name": "{TOOL_NAME}", "arguments": '
            f'{{"action": ...}}}}</tool_call>, got "{snippet}".'
        )
    found: list[A.Action] = []
    for i, blob in enumerate(blobs, start=1):
        where = f"Tool call {i}" if len(blobs) > 1 else "The tool call"
        value = _load_json(blob, where)
        for call in value if isinstance(value, list) else [value]:
            found.append(action_from_arguments(_arguments(call, where)))
    return found


# --- grounding answers ----------------------------------------------------------------------------------

_POINT_2D = re.compile(rf'"?point_2d"?\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]')
_BBOX_2D = re.compile(rf'"?bbox_2d"?\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]')


def parse_point(text: str) -> A.Point | None:
    """The first point a grounding answer names: `{"point_2d": [x, y]}`, or the centre of
    `{"bbox_2d": [x1, y1, x2, y2]}` (0-1000 grid, fences and trailing text tolerated); None when there is none."""
    text = _THINK.sub("", text)
    point, box = _POINT_2D.search(text), _BBOX_2D.search(text)
    if point and (not box or point.start() < box.start()):
        return float(point.group(1)), float(point.group(2))
    if box:
        x1, y1, x2, y2 = (float(g) for g in box.groups())
        return (x1 + x2) / 2, (y1 + y2) / 2
    return None
