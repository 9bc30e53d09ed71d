"""OpenAI tool calls ↔ Qwen3-VL's own tool-call text (the "hermes" format vLLM parses for Qwen).

Qwen3-VL's chat template shows the `tools` in the system prompt and asks for each call as

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

A reply is turned into OpenAI's `tool_calls` here, whole (`parse_reply`) or while it streams
(`ToolCallStream`). A call whose body is not a JSON object naming one of the request's functions, with
arguments that are a JSON object, is not a call: the reply then stays plain `content`, as vLLM's hermes
parser leaves it, never an error. Going the other way, an assistant message's `tool_calls` and a `tool`
message's result become the text the template itself renders for them (`assistant_text`,
`tool_result_text`), so a conversation sent back by a stateless client reads to the model exactly as
the template would show it, and matches the pooled session that wrote the calls.

This module knows nothing about engines or HTTP.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

START = "<tool_call>"
END = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI carries it: a string
    id: str

    def wire(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def assistant_text(content: str, calls: list[tuple[str, str]]) -> str:
    """An assistant message with `calls` ((name, arguments JSON) pairs) as Qwen3-VL's template renders
    it: the content, then each call on lines of its own."""
    out = content
    for i, (name, arguments) in enumerate(calls):
        if i or content:
            out += "\n"
        out += f'{START}\n{{"name": "{name}", "arguments": {arguments}}}\n{END}'
    return out


def tool_result_text(content: str) -> str:
    """A `tool` message as the template renders it inside the user turn that carries the results
    (consecutive results are joined with a newline, which is how user messages of one turn join)."""
    return f"<tool_response>\n{content}\n</tool_response>"


def parse_call(body: str, names: frozenset[str]) -> ToolCall | None:
    """The call in the text between `<tool_call>` and `</tool_call>`, or None when it is not one."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or value["name"] not in names:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some replies carry the arguments already as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), call_id())


def parse_reply(text: str, names: frozenset[str]) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) for a whole reply. Content is the text outside the calls, None when there is
    none; when any call is malformed (or the reply ends inside one) there are no calls and the whole
    reply is the content."""
    calls: list[ToolCall] = []
    outside: list[str] = []
    rest = text
    while START in rest:
        before, _, after = rest.partition(START)
        body, found, rest = after.partition(END)
        call = parse_call(body, names) if found else None
        if call is None:
            return text, []
        outside.append(before)
        calls.append(call)
    if not calls:
        return text, []
    content = "".join([*outside, rest]).strip()
    return content or None, calls


class ToolCallStream:
    """Streams a reply as OpenAI deltas, turning each `<tool_call>` block into `delta.tool_calls`.

    Text outside calls streams as it comes, except a tail that may be the start of `<tool_call>`. A call
    is held until its `</tool_call>`, then sent as two deltas: its id, type and name with empty
    arguments, then the arguments (clients join argument fragments by index). A block that is not a
    valid call goes out as the content it is. `push` and `flush` return the deltas to send."""

    def __init__(self, names: frozenset[str], single: bool = False):
        self.names = names
        self.single = single  # parallel_tool_calls=false: calls after the first are dropped
        self.calls: list[ToolCall] = []
        self._pending = ""  # text not sent yet
        self._in_call = False
        self._searched = 0  # how much of a call's text has been searched for its end

    def push(self, piece: str) -> list[dict]:
        self._pending += piece
        deltas: list[dict] = []
        while True:
            if self._in_call:
                # Only the new text (and a possible split end tag) is searched: a long call costs linear time.
                at = self._pending.find(END, max(0, self._searched - len(END) + 1))
                if at < 0:
                    self._searched = len(self._pending)
                    return deltas
                body, rest = self._pending[:at], self._pending[at + len(END) :]
                self._pending, self._in_call, self._searched = rest, False, 0
                call = parse_call(body, self.names)
                if call is None:
                    deltas += self._content(START + body + END)
                elif not (self.single and self.calls):
                    deltas.extend(self._call(call))
                continue
            at = self._pending.find(START)
            if at < 0:
                cut = len(self._pending) - _partial_start(self._pending)
                if self.calls and not self._pending[:cut].strip():
                    return deltas  # after a call, white space waits for words (or the end, which drops it)
                deltas += self._content(self._pending[:cut])
                self._pending = self._pending[cut:]
                return deltas
            deltas += self._content(self._pending[:at])
            self._pending, self._in_call = self._pending[at + len(START) :], True

    def flush(self) -> list[dict]:
        """What is left at the end of the reply: an unfinished call or a held-back tail, as content."""
        text = (START if self._in_call else "") + self._pending
        self._pending, self._in_call = "", False
        return self._content(text)

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def _content(self, text: str) -> list[dict]:
        # After a call, only text that says something goes out (the newlines between calls do not).
        if not text or (self.calls and not text.strip()):
            return []
        return [{"content": text}]

    def _call(self, call: ToolCall) -> list[dict]:
        index = len(self.calls)
        self.calls.append(call)
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        return [{"tool_calls": [head]}, {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}]


def _partial_start(text: str) -> int:
    """How many trailing characters of `text` could begin `<tool_call>`."""
    for n in range(min(len(START) - 1, len(text)), 0, -1):
        if START.startswith(text[-n:]):
            return n
    return 0
