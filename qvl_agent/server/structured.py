"""`response_format`: replies that must be JSON, or JSON matching a schema.

Decoding is not constrained. The model is told what to write (`prompts/server_json_object.txt` or
`prompts/server_json_schema.txt`, added to the system text), and its finished reply is checked: a reply
wrapped in one Markdown code fence is unwrapped, then it must parse as one JSON object (`json_object`)
that the schema accepts (`json_schema`, with `jsonschema`'s Draft 2020-12 validator). A reply that fails
is answered with 422 `invalid_model_output` naming what was wrong, never passed on as if it were valid;
a reply cut short by `max_tokens` is passed on unchecked with `finish_reason: "length"`, as OpenAI does.

Schemas come from the request and are hostile until checked (`check_schema`): bounded in size and
depth, and in size with their references followed (so neither recursion nor references that double at
each level can make validation run for hours), no references outside the schema itself (nothing is ever
fetched), no regular expressions (a `pattern` can take exponential time on a reply), and it must be a
valid schema.
"""

from __future__ import annotations

import json
import re

from qvl_agent import prompts
from qvl_agent.server.api_error import ApiError

MAX_SCHEMA_CHARS = 65_536
MAX_SCHEMA_DEPTH = 32
MAX_EXPANDED_NODES = 20_000
REFUSED_KEYWORDS = ("pattern", "patternProperties", "$dynamicRef", "$recursiveRef")
NAME_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")  # names -> schemas
DATA_KEYWORDS = ("enum", "const", "default", "examples")  # values, not schemas
_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```\s*\Z", re.DOTALL)
PARAM = "response_format"


def check_schema(schema: dict, param: str = PARAM + ".json_schema.schema") -> dict:
    """`schema` if it is one this server checks replies against; 400 naming what is wrong otherwise."""
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise ApiError(400, f"The JSON schema is over {MAX_SCHEMA_CHARS:,} characters.", param=param)
    _walk(schema, param, 0)
    _check_expansion(schema, param)
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ApiError(400, f"The JSON schema is not valid ({_first_line(exc.message)}).", param=param) from None
    except RecursionError:
        raise ApiError(400, "The JSON schema refers to itself without end.", param=param) from None
    return schema


def _walk(value, param: str, depth: int, names: bool = False) -> None:
    """Depth, refused keywords and references, schema by schema. `names`: `value` maps names to schemas
    (`properties`, `$defs`): its keys are the client's names, not keywords."""
    if depth > MAX_SCHEMA_DEPTH:
        raise ApiError(400, f"The JSON schema is nested more than {MAX_SCHEMA_DEPTH} levels deep.", param=param)
    if isinstance(value, dict):
        for key, item in value.items():
            if names:
                _walk(item, param, depth + 1)
                continue
            if key in REFUSED_KEYWORDS:
                raise ApiError(400, f"JSON schemas with {key!r} are not supported here.", param=param)
            if key == "$ref" and not (isinstance(item, str) and item.startswith("#")):
                raise ApiError(400, "A JSON schema may only refer to its own parts ($ref: '#...').", param=param)
            if key not in DATA_KEYWORDS:
                _walk(item, param, depth + 1, names=key in NAME_MAPS)
    elif isinstance(value, list):
        for item in value:
            _walk(item, param, depth + 1)


def _check_expansion(schema: dict, param: str) -> None:
    """Refuse a schema whose references, followed, make it larger than MAX_EXPANDED_NODES: validation
    visits every node so expanded, and references that double at each level (allOf of two references
    to the next level, thirty levels deep) would otherwise take hours. A schema that refers to itself
    never ends, so it is refused too."""
    seen = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_EXPANDED_NODES:
            raise ApiError(
                400,
                f"The JSON schema, its references followed, is larger than {MAX_EXPANDED_NODES:,} parts "
                "(or refers to itself); send a smaller, non-recursive schema.",
                param=param,
            )
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                stack.append(_pointer(schema, ref, param))
            stack.extend(v for k, v in node.items() if k not in DATA_KEYWORDS and k != "$ref")
        elif isinstance(node, list):
            stack.extend(node)


def _pointer(schema: dict, ref: str, param: str):
    """The part of `schema` a local `$ref` ("#", "#/$defs/Name") points to; 400 when there is none."""
    node = schema
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise ApiError(400, f"The JSON schema's reference {ref[:80]!r} points to nothing.", param=param)
    if ref != "#" and not ref.startswith("#/"):
        raise ApiError(400, "A JSON schema may only refer to its own parts by JSON pointer ('#/...').", param=param)
    return node


def instruction(kind: str, schema: dict | None) -> str:
    """What the model is told to write, added to the system text."""
    if kind == "json_schema":
        return prompts.load("server_json_schema").render(schema=json.dumps(schema, ensure_ascii=False))
    return prompts.load("server_json_object").render()


def check_reply(text: str, kind: str, schema: dict | None) -> str:
    """The reply as the client gets it (unwrapped from a code fence), or 422 saying why it is not JSON
    of the asked shape."""
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _mismatch(f"the model's reply is not valid JSON ({_first_line(str(exc))})") from None
    if not isinstance(value, dict):
        raise _mismatch("the model's reply is JSON but not an object")
    if kind == "json_schema" and schema is not None:
        from jsonschema import Draft202012Validator

        try:
            error = next(iter(Draft202012Validator(schema).iter_errors(value)), None)
        except RecursionError:
            raise _mismatch("the schema refers to itself without end") from None
        if error is not None:
            where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the top level"
            raise _mismatch(f"the model's reply does not match the schema at {where}: {_first_line(error.message)}")
    return body.strip()


def _mismatch(reason: str) -> ApiError:
    return ApiError(
        422,
        f"No answer of the requested response_format: {reason}. Decoding is not constrained here; "
        "retry, or describe the format in the prompt.",
        type="invalid_response_error",
        code="invalid_model_output",
        param=PARAM,
    )


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no details"
    return line if len(line) <= 200 else line[:197] + "..."
