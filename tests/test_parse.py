# ruff: noqa: E501  (the corpus holds whole model replies, one per line)
"""The parser against a corpus of realistic Qwen3-VL replies, good and broken."""

from __future__ import annotations

import pytest

from qvl_agent import actions as A
from qvl_agent.errors import ParseError
from qvl_agent.parse import parse_actions


def call(args: str) -> str:
    return f'<tool_call>\n{{"name": "computer_use", "arguments": {args}}}\n</tool_call>'


GOOD = [
    # The canonical format, every action.
    (call('{"action": "left_click", "coordinate": [512, 384]}'), [A.LeftClick(512, 384)]),
    (call('{"action": "right_click", "coordinate": [10, 990]}'), [A.RightClick(10, 990)]),
    (call('{"action": "middle_click", "coordinate": [0, 0]}'), [A.MiddleClick(0, 0)]),
    (call('{"action": "double_click", "coordinate": [1000, 1000]}'), [A.DoubleClick(1000, 1000)]),
    (call('{"action": "triple_click", "coordinate": [250.5, 750.25]}'), [A.TripleClick(250.5, 750.25)]),
    (call('{"action": "mouse_move", "coordinate": [300, 200]}'), [A.MouseMove(300, 200)]),
    (call('{"action": "left_click_drag", "coordinate": [700, 400]}'), [A.LeftClickDrag(700, 400)]),
    (
        call('{"action": "left_click_drag", "start_coordinate": [100, 120], "coordinate": [700, 400]}'),
        [A.LeftClickDrag(700, 400, 100, 120)],
    ),
    (call('{"action": "key", "keys": ["ctrl", "s"]}'), [A.Key(("ctrl", "s"))]),
    (call('{"action": "key", "keys": ["Enter"]}'), [A.Key(("enter",))]),
    (
        call('{"action": "type", "text": "Hello, world: \\"quoted\\"\\n"}'),
        [A.Type('Hello, world: "quoted"\n')],
    ),
    (call('{"action": "scroll", "pixels": -300}'), [A.Scroll(-300)]),
    (call('{"action": "scroll", "pixels": 5, "coordinate": [500, 500]}'), [A.Scroll(5, 500, 500)]),
    (call('{"action": "hscroll", "pixels": 120}'), [A.HScroll(120)]),
    (call('{"action": "wait", "time": 2}'), [A.Wait(2)]),
    (call('{"action": "terminate", "status": "success"}'), [A.Terminate("success")]),
    (call('{"action": "terminate", "status": "Failure"}'), [A.Terminate("failure")]),
    (call('{"action": "answer", "text": "The total is 42."}'), [A.Answer("The total is 42.")]),
    # No newlines around the JSON, closing tag on the same line.
    (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}</tool_call>',
        [A.LeftClick(1, 2)],
    ),
    # A "Thought: ... Action: ..." preamble before the call.
    (
        "Thought: The login form is open; the user name field is at the top left.\n"
        "Action: Click the user name field.\n" + call('{"action": "left_click", "coordinate": [180, 220]}'),
        [A.LeftClick(180, 220)],
    ),
    # Several calls in one reply run in order.
    (
        call('{"action": "left_click", "coordinate": [400, 300]}')
        + "\n"
        + call('{"action": "type", "text": "qwen"}')
        + "\n"
        + call('{"action": "key", "keys": ["enter"]}'),
        [A.LeftClick(400, 300), A.Type("qwen"), A.Key(("enter",))],
    ),
    # A ```json fence instead of tags.
    (
        '```json\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [5, 6]}}\n```',
        [A.LeftClick(5, 6)],
    ),
    # A fence inside the tags.
    (
        '<tool_call>\n```json\n{"name": "computer_use", "arguments": {"action": "wait", "time": 1}}\n```\n</tool_call>',
        [A.Wait(1)],
    ),
    # "Action:" followed by bare JSON.
    (
        'Thought: done.\nAction: {"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}',
        [A.Terminate("success")],
    ),
    # A bare arguments object without the name wrapper.
    ('<tool_call>{"action": "left_click", "coordinate": [10, 20]}</tool_call>', [A.LeftClick(10, 20)]),
    # Arguments as a JSON string (OpenAI style).
    (
        '<tool_call>{"name": "computer_use", "arguments": "{\\"action\\": \\"key\\", \\"keys\\": [\\"esc\\"]}"}'
        "</tool_call>",
        [A.Key(("esc",))],
    ),
    # A <think> block with an example call inside it does not count.
    (
        '<think>maybe {"action": "left_click", "coordinate": [1, 1]}?</think>\n'
        + call('{"action": "left_click", "coordinate": [9, 9]}'),
        [A.LeftClick(9, 9)],
    ),
    # Small slips with one meaning.
    (call('{"action": "left_click", "coordinate": [100, 200],}'), [A.LeftClick(100, 200)]),  # trailing comma
    (
        "<tool_call>\n{'name': 'computer_use', 'arguments': {'action': 'type', 'text': \"it's here\"}}\n</tool_call>",
        [A.Type("it's here")],
    ),  # single quotes
    (
        '<tool_call>{name: "computer_use", arguments: {action: "key", keys: ["ctrl", "a"]}}</tool_call>',
        [A.Key(("ctrl", "a"))],
    ),  # unquoted keys
    (
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [3, 4]}}\n',
        [A.LeftClick(3, 4)],
    ),  # missing closing tag
    (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [3, 4]}</tool_call>',
        [A.LeftClick(3, 4)],
    ),  # missing closing brace
    (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [3, 4]}}}</tool_call>',
        [A.LeftClick(3, 4)],
    ),  # one brace too many
    (call('{"action": "left_click", "coordinate": "(640, 360)"}'), [A.LeftClick(640, 360)]),  # point as text
    (call('{"action": "left_click", "coordinate": ["640", "360"]}'), [A.LeftClick(640, 360)]),
    (call('{"action": "key", "keys": "ctrl+shift+t"}'), [A.Key(("ctrl", "shift", "t"))]),  # chord as text
    (call('{"action": "click", "coordinate": [7, 8]}'), [A.LeftClick(7, 8)]),  # Qwen2.5-era name
    # Commas and colons inside text survive the repairs.
    (call('{"action": "type", "text": "a, b: c",}'), [A.Type("a, b: c")]),
]


@pytest.mark.parametrize(("reply", "expected"), GOOD)
def test_good_replies_parse_to_actions(reply, expected):
    assert parse_actions(reply) == expected


BROKEN = [
    ("", "empty"),
    ("   \n", "empty"),
    ("I will click the submit button now.", "no tool call"),
    (call('{"action": "left_click"}'), 'left_click needs "coordinate"'),
    (call('{"action": "left_click", "coordinate": [1, 2, 3, 4]}'), "got 4 numbers"),
    (call('{"action": "left_click", "coordinate": ["left", "top"]}'), "must be a number"),
    (call('{"action": "left_click", "coordinate": [NaN, 3]}'), "finite"),
    (call('{"action": "fly", "coordinate": [1, 2]}'), 'Unknown action "fly"'),
    (call('{"coordinate": [1, 2]}'), 'no "action"'),
    (call('{"action": "key"}'), 'key needs "keys"'),
    (call('{"action": "key", "keys": []}'), 'key needs "keys"'),
    (call('{"action": "type"}'), 'type needs "text"'),
    (call('{"action": "answer", "text": 5}'), 'answer needs "text"'),
    (call('{"action": "scroll"}'), 'scroll needs "pixels"'),
    (call('{"action": "wait"}'), 'wait needs "time"'),
    (call('{"action": "wait", "time": 3600}'), "between 0 and 60"),
    (call('{"action": "terminate", "status": "done"}'), '"success" or "failure"'),
    (
        '<tool_call>{"name": "browser", "arguments": {"action": "left_click", "coordinate": [1, 2]}}</tool_call>',
        'unknown tool "browser"',
    ),
    (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "type", "text": "unterminated}}</tool_call>',
        "not valid JSON",
    ),
    ("<tool_call>left_click(500, 300)</tool_call>", "not valid JSON"),
    ("<tool_call></tool_call>", "empty"),
    ('<tool_call>["computer_use", "left_click"]</tool_call>', "must be a JSON object"),
    # One good call and one broken: nothing runs, and the error says which call.
    (
        call('{"action": "left_click", "coordinate": [1, 2]}') + call('{"action": "type"}'),
        'type needs "text"',
    ),
    (call('{"action": "left_click", "coordinate": [1, 2]}') + "<tool_call>{oops</tool_call>", "Tool call 2"),
]


@pytest.mark.parametrize(("reply", "message"), BROKEN)
def test_broken_replies_name_what_is_wrong(reply, message):
    with pytest.raises(ParseError) as info:
        parse_actions(reply)
    text = str(info.value)
    assert message in text
    assert "\n" not in text  # one sentence, shown to the model and the person


def test_round_trip_through_arguments():
    # What the agent writes into history as text must parse back to the same action.
    import json

    for cls_args in [
        A.LeftClick(1, 2),
        A.LeftClickDrag(5, 6, 1, 2),
        A.Scroll(-3, 4, 5),
        A.Key(("alt", "f4")),
        A.Type("x"),
        A.Wait(0.5),
        A.Terminate("failure"),
        A.Answer("y"),
        A.HScroll(7),
    ]:
        reply = call(json.dumps(A.to_arguments(cls_args)))
        assert parse_actions(reply) == [cls_args]
