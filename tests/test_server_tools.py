"""What agent frameworks need from the OpenAI API, through the official `openai` client against a real
server on 127.0.0.1: `tools` shown to the model and its `<tool_call>` replies returned as `tool_calls`
(streaming and not), tool results sent back, a browser-use-style loop, `response_format` JSON replies,
and every parameter the server cannot honour refused with a 400 naming it. The replay engine's replies
are written as Qwen3-VL writes them; with the tiny model, the prompt is the chat template's own."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from pydantic import BaseModel

from qvl_agent.engine.remote import RemoteEngine
from qvl_agent.engine.replay import ReplayEngine
from tests.support.live_server import EchoEngine
from tests.test_server import AUTH, png_url, post, serve, user

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "click_element",
            "description": "Click the element with this index.",
            "parameters": {"type": "object", "properties": {"index": {"type": "integer"}}, "required": ["index"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "go_to_url",
            "description": "Open a URL in the current tab.",
            "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
        },
    },
]


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=AUTH["Authorization"].split()[1], max_retries=0)


def ask(url, messages, **kw):
    return client(url).chat.completions.create(model="qvl-test-model", messages=messages, **kw)


def streamed(url, messages, **kw) -> tuple[str | None, list[dict], str]:
    """(content, tool calls, finish reason) of a streamed reply, reassembled as clients do: by index."""
    content, calls, finish = [], {}, None
    for chunk in ask(url, messages, stream=True, **kw):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] = (tc.function.name if tc.function else None) or slot["name"]
                slot["arguments"] += (tc.function.arguments if tc.function else None) or ""
            finish = choice.finish_reason or finish
    return ("".join(content) or None), [calls[i] for i in sorted(calls)], finish


def test_a_tool_call_comes_back_as_tool_calls_and_the_tools_reach_the_template():
    reply = "I will open the page first.\n" + call("go_to_url", url="https://example.com")
    engine = ReplayEngine([reply])
    with serve(engine) as url:
        answer = ask(url, [user("Open example.com", png_url())], tools=TOOLS)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will open the page first."
    [tc] = choice.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_")
    assert tc.function.name == "go_to_url" and json.loads(tc.function.arguments) == {"url": "https://example.com"}
    assert engine.requests[0].tools == TOOLS  # shown by the chat template, as the client sent them


def test_streamed_tool_calls_reassemble_by_index_and_no_tag_leaks_into_content():
    reply = call("click_element", index=3) + "\n" + call("go_to_url", url="https://a.example/?q=<b>")
    with serve(ReplayEngine([reply, reply])) as url:
        content, calls, finish = streamed(url, [user("Do both")], tools=TOOLS)
        raw = post(url, {"messages": [user("Do both")], "tools": TOOLS, "stream": True, "parallel_tool_calls": False})
    assert finish == "tool_calls" and content is None
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("click_element", {"index": 3}),
        ("go_to_url", {"url": "https://a.example/?q=<b>"}),
    ]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    events = [json.loads(line[6:]) for line in raw.text.splitlines() if line.startswith("data: {")]
    indexes = {tc["index"] for e in events for c in e["choices"] for tc in c["delta"].get("tool_calls", [])}
    assert indexes == {0}  # parallel_tool_calls=false: the first call only
    assert "<tool_call>" not in raw.text


def test_text_around_a_call_streams_as_content_and_a_plain_reply_is_untouched():
    replies = ["Sure. " + call("click_element", index=1) + "\nDone.", "No tool is needed: 4."]
    with serve(ReplayEngine(replies)) as url:
        content, calls, finish = streamed(url, [user("Click it")], tools=TOOLS)
        assert (content, finish) == ("Sure. \nDone.", "tool_calls")
        assert [c["name"] for c in calls] == ["click_element"]
        plain = ask(url, [user("2+2?")], tools=TOOLS).choices[0]
        assert (plain.message.content, plain.message.tool_calls, plain.finish_reason) == (
            "No tool is needed: 4.",
            None,
            "stop",
        )


MALFORMED = [
    "<tool_call>\nclick the OK button\n</tool_call>",  # not JSON
    call("delete_everything", path="/"),  # a function the request did not offer
    '<tool_call>\n{"name": "click_element", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
    '<tool_call>\n{"name": "click_element", "arguments": {"index": 3}',  # cut off inside the call
    "<tool_call>\n" + "[" * 5000 + "\n</tool_call>",  # nested past the JSON parser's depth
]


@pytest.mark.parametrize("reply", MALFORMED, ids=["not-json", "unknown-name", "bad-arguments", "unfinished", "deep"])
def test_a_malformed_tool_call_is_returned_as_content_never_a_500(reply):
    with serve(ReplayEngine([reply, reply])) as url:
        whole = ask(url, [user("Click OK")], tools=TOOLS).choices[0]
        content, calls, finish = streamed(url, [user("Click OK")], tools=TOOLS)
    assert (whole.message.content, whole.message.tool_calls, whole.finish_reason) == (reply, None, "stop")
    assert (content, calls, finish) == (reply, [], "stop")


def test_tool_choice_none_shows_no_tools_and_parses_no_calls():
    reply = call("click_element", index=2)
    engine = ReplayEngine([reply])
    with serve(engine) as url:
        answer = ask(url, [user("Click")], tools=TOOLS, tool_choice="none").choices[0]
    assert engine.requests[0].tools is None
    assert answer.message.content == reply and answer.message.tool_calls is None


def test_a_browser_use_style_tool_loop_runs_to_its_answer():
    """The framework's loop: ask with tools, run each call, send the results back, until a plain answer."""
    replies = [
        call("go_to_url", url="https://shop.example"),
        "The search box is element 7.\n" + call("click_element", index=7),
        "The page lists 3 results for 'lamp'.",
    ]
    engine = ReplayEngine(replies)
    ran = []

    def result(name: str) -> str:
        return f"Ran {name}: ok. Interactive elements: [7]<input placeholder=Search>"

    def run_tool(name: str, arguments: dict) -> str:
        ran.append((name, arguments))
        return result(name)

    messages = [{"role": "system", "content": "You are a browser agent."}, user("Find lamps", png_url())]
    with serve(engine) as url:
        api = client(url)
        for _step in range(5):
            raw = api.chat.completions.with_raw_response.create(model="qvl-test-model", messages=messages, tools=TOOLS)
            reply = raw.parse().choices[0]
            messages.append(reply.message.model_dump(exclude_none=True))
            if reply.finish_reason != "tool_calls":
                break
            for tc in reply.message.tool_calls:
                output = run_tool(tc.function.name, json.loads(tc.function.arguments))
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": output})
        reused = raw.headers["x-qvl-session-reused"]
    assert reply.message.content == "The page lists 3 results for 'lamp'."
    assert ran == [("go_to_url", {"url": "https://shop.example"}), ("click_element", {"index": 7})]
    last = engine.requests[-1]
    # The model reads its own calls back as it wrote them, and the results as the template shows them.
    assert [reply for _, reply in last.history] == replies[:2]
    assert last.text == f"<tool_response>\n{result('click_element')}\n</tool_response>"
    assert reused == "true"  # the stateless client's conversation matched the session that wrote the calls
    assert all(r.tools == TOOLS and r.system == "You are a browser agent." for r in engine.requests)


def test_tools_pass_through_a_remote_engine_and_its_calls_come_back():
    """`serve --engine openai:URL` in front of another server that parses tool calls (as vLLM does)."""
    backend = ReplayEngine([call("click_element", index=4), "Clicked."])
    with serve(backend) as back_url:
        remote = RemoteEngine(back_url, api_key=AUTH["Authorization"].split()[1], model="qvl-test-model")
        with serve(remote) as url:
            first = ask(url, [user("Click 4")], tools=TOOLS).choices[0]
            [tc] = first.message.tool_calls
            result = {"role": "tool", "tool_call_id": tc.id, "content": "ok"}
            messages = [user("Click 4"), first.message.model_dump(exclude_none=True), result]
            content, calls, finish = streamed(url, messages, tools=TOOLS)
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("click_element", {"index": 4})
    assert (content, calls, finish) == ("Clicked.", [], "stop")
    assert backend.requests[0].tools == TOOLS
    assert backend.requests[1].history == [("Click 4", call("click_element", index=4))]
    assert backend.requests[1].text == "<tool_response>\nok\n</tool_response>"


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    from qvl_agent.engine.qwen3vl import Qwen3VLEngine

    engine = Qwen3VLEngine.load(str(tiny_model_dir), device="cpu")
    yield engine
    engine.close()


def test_tool_messages_render_as_the_chat_template_renders_them(tiny_engine):
    """With the tiny model's copy of Qwen3-VL's template: the prompt the engine builds for a request with
    tools, an assistant's tool calls and two tool results equals the template's own rendering of the
    OpenAI messages."""
    engine = tiny_engine
    rendered: list[str] = []
    original = engine.render

    def spy(messages, tools, add_generation_prompt):
        rendered.append(original(messages, tools, add_generation_prompt))
        return rendered[-1]

    engine.render = spy
    messages = [
        {"role": "system", "content": "You are a browser agent."},
        {"role": "user", "content": "Open two pages"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "go_to_url", "arguments": '{"url": "a"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "go_to_url", "arguments": '{"url": "b"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "opened a"},
        {"role": "tool", "tool_call_id": "call_2", "content": "opened b"},
    ]
    try:
        with serve(engine) as url:
            whole = ask(url, messages, tools=TOOLS, max_tokens=4).choices[0]
            content, calls, finish = streamed(url, messages, tools=TOOLS, max_tokens=4)
    finally:
        del engine.render
    expected = engine.processor.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert rendered and all(r == expected for r in rendered)
    # Random weights write no tool call: the reply is plain content, the same streamed or not.
    assert (content, calls, finish) == (whole.message.content, [], whole.finish_reason)
    assert "<tool_response>\nopened a\n</tool_response>\n<tool_response>\nopened b\n</tool_response>" in expected
    assert "# Tools" in expected and '"name": "click_element"' in expected


@pytest.mark.parametrize(
    "choice,opening",
    [
        ("required", '<tool_call>\n{"name":'),
        ({"type": "function", "function": {"name": "go_to_url"}}, '<tool_call>\n{"name": "go_to_url", "arguments":'),
    ],
    ids=["required", "named"],
)
def test_tool_choice_required_or_named_makes_the_local_model_open_a_call(tiny_engine, choice, opening):
    """The local engine writes the call's opening and the model goes on from there. Random weights then
    write no valid call, so the reply comes back as content, and it begins with that opening."""
    with serve(tiny_engine) as url:
        whole = ask(url, [user("Open a page")], tools=TOOLS, tool_choice=choice, max_tokens=24).choices[0]
        content, calls, _ = streamed(url, [user("Open a page")], tools=TOOLS, tool_choice=choice, max_tokens=24)
    for text, tool_calls in ((whole.message.content, whole.message.tool_calls), (content, calls)):
        assert (text or "").startswith(opening) or (tool_calls and opening.endswith('"arguments":'))


def test_the_local_engine_begins_a_json_reply_with_a_brace(tiny_engine):
    with serve(tiny_engine) as url:
        fmt = {"type": "json_object"}
        cut = ask(url, [user("JSON")], response_format=fmt, max_tokens=3, extra_body={"min_tokens": 3}).choices[0]
    assert cut.finish_reason == "length" and cut.message.content.startswith("{")  # cut short: passed on


# --- response_format ------------------------------------------------------------------------------------


class Flight(BaseModel):
    origin: str
    seats: int


def test_json_object_replies_are_json_streaming_and_not():
    fenced = '```json\n{"answer": 42}\n```'
    engine = ReplayEngine([fenced, '{"answer": 42}'])
    with serve(engine) as url:
        whole = ask(url, [user("Reply in JSON")], response_format={"type": "json_object"}).choices[0]
        content, _, finish = streamed(url, [user("Reply in JSON")], response_format={"type": "json_object"})
    assert json.loads(whole.message.content) == {"answer": 42} and whole.finish_reason == "stop"
    assert json.loads(content) == {"answer": 42} and finish == "stop"
    assert "JSON object" in engine.requests[0].system  # the model is told to write JSON


def test_json_schema_replies_parse_into_the_clients_model():
    engine = ReplayEngine(['{"origin": "OSL", "seats": 2}', '{"origin": "OSL", "seats": 2}'])
    with serve(engine) as url:
        parsed = (
            client(url)
            .chat.completions.parse(model="qvl-test-model", messages=[user("Book it")], response_format=Flight)
            .choices[0]
        )
        schema = {"type": "json_schema", "json_schema": {"name": "Flight", "schema": Flight.model_json_schema()}}
        content, _, _ = streamed(url, [user("Book it")], response_format=schema)
    assert parsed.message.parsed == Flight(origin="OSL", seats=2)
    assert Flight.model_validate_json(content) == Flight(origin="OSL", seats=2)
    assert '"seats"' in engine.requests[0].system  # the schema is shown to the model


@pytest.mark.parametrize(
    "reply,fmt,why",
    [
        ("Sure! Here it is: {", {"type": "json_object"}, "not valid JSON"),
        ("[1, 2]", {"type": "json_object"}, "not an object"),
        ('{"origin": "OSL", "seats": "two"}', "flight", "at ['seats']"),
    ],
)
def test_a_reply_that_is_not_the_asked_json_is_a_422_not_a_false_success(reply, fmt, why):
    if fmt == "flight":
        fmt = {"type": "json_schema", "json_schema": {"name": "Flight", "schema": Flight.model_json_schema()}}
    with serve(ReplayEngine([reply, reply])) as url:
        with pytest.raises(openai.UnprocessableEntityError) as err:
            ask(url, [user("JSON please")], response_format=fmt)
        with pytest.raises(openai.UnprocessableEntityError):
            list(ask(url, [user("JSON please")], response_format=fmt, stream=True))
    assert err.value.body["code"] == "invalid_model_output" and why in err.value.body["message"]
    assert err.value.body["param"] == "response_format"


def test_a_reply_cut_short_by_max_tokens_is_passed_on_with_finish_length():
    with serve(EchoEngine()) as url:
        answer = ask(url, [user("a b c d e f")], response_format={"type": "json_object"}, max_tokens=2).choices[0]
    assert answer.finish_reason == "length" and answer.message.content


# --- what is refused, what passes ----------------------------------------------------------------------

REFUSED = [
    ({"logprobs": True}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 3}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),  # out of OpenAI's range
    ({"logit_bias": {"100": 5}}, "logit_bias"),
    ({"n": 2}, "n"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "click_element"}}}, "tool_choice"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS * 65}, "tools"),
]


@pytest.mark.parametrize("extra,param", REFUSED, ids=[p for _, p in REFUSED])
def test_what_the_server_cannot_honour_is_a_400_naming_the_parameter(extra, param):
    with serve(EchoEngine()) as url:
        with pytest.raises(openai.BadRequestError) as err:
            ask(url, [user("x")], **extra)
    assert err.value.status_code == 400 and err.value.body["param"] == param, err.value.body
    assert param.split(".")[0].split("[")[0] in err.value.body["message"] or param == "n"


def test_neutral_values_that_clients_send_by_default_are_accepted():
    neutral = dict(
        frequency_penalty=0,
        presence_penalty=0,
        logprobs=False,
        top_logprobs=0,
        logit_bias={},
        parallel_tool_calls=True,
        tools=TOOLS,
        tool_choice="auto",
        response_format={"type": "text"},
        seed=7,
        user="someone",
        store=False,
        metadata={"run": "1"},
        modalities=["text"],
    )
    with serve(EchoEngine()) as url:
        answer = ask(url, [user("hello")], **neutral).choices[0]
    assert answer.message.content.startswith("echo:hello") and answer.finish_reason == "stop"


def test_browser_use_defaults_are_served_with_their_frequency_penalty():
    """browser-use's ChatOpenAI sends temperature 0.2, frequency_penalty 0.3, max_completion_tokens 4096
    and its agent output as a strict json_schema."""
    schema = {
        "type": "object",
        "properties": {"thinking": {"type": "string"}, "action": {"type": "array", "items": {"type": "object"}}},
        "required": ["thinking", "action"],
        "additionalProperties": False,
    }
    engine = EchoEngine()
    with serve(engine) as url:
        with pytest.raises(openai.UnprocessableEntityError):  # the echo engine writes no JSON
            ask(
                url,
                [user("Find lamps")],
                temperature=0.2,
                frequency_penalty=0.3,
                max_completion_tokens=4096,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "agent_output", "strict": True, "schema": schema},
                },
            )
    [options] = engine.options
    assert (options.temperature, options.frequency_penalty, options.max_new_tokens) == (0.2, 0.3, 4096)


@pytest.mark.parametrize(
    "extra,why",
    [
        ({"tool_choice": "required"}, "has no tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "not one of the tools"),
        ({"tools": TOOLS, "tool_choice": "required"}, "needs the local engine"),
    ],
)
def test_a_tool_choice_that_cannot_be_kept_is_a_400(extra, why):
    with serve(ReplayEngine(["never used"])) as url:
        r = post(url, {"messages": [user("x")], **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice" and why in r.text, r.text


def test_a_tool_message_needs_a_call_before_it():
    with serve(EchoEngine()) as url:
        r = post(url, {"messages": [user("x"), {"role": "tool", "tool_call_id": "c", "content": "r"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].role"


HOSTILE_SCHEMAS = [
    ("deep", {"type": "object", "properties": {"a": {"items": {"items": {}}}}}, None),
    ("pattern", {"type": "string", "pattern": "(a+)+$"}, "'pattern'"),
    ("remote-ref", {"$ref": "https://example.com/schema.json"}, "own parts"),
    ("not-a-schema", {"type": 12}, "not valid"),
    ("recursive", {"$ref": "#"}, "refers to itself"),
    ("doubling", None, "larger than"),  # allOf of two references to the next level, 30 levels deep
    ("dangling-ref", {"$ref": "#/$defs/Nothing"}, "points to nothing"),
]
DOUBLING = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(30)} | {"d30": {"type": "object"}}


@pytest.mark.parametrize("name,schema,why", HOSTILE_SCHEMAS, ids=[h[0] for h in HOSTILE_SCHEMAS])
def test_a_hostile_schema_is_a_quick_400(name, schema, why):
    if name == "deep":
        for _ in range(60):
            schema = {"type": "object", "properties": {"a": schema}}
        why = "nested"
    if name == "doubling":
        schema = {"$defs": DOUBLING, "$ref": "#/$defs/d0"}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with serve(EchoEngine()) as url:
        start = time.perf_counter()
        r = post(url, {"messages": [user("x")], "response_format": fmt})
        assert time.perf_counter() - start < 5
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "response_format.json_schema.schema"
        assert httpx.get(url + "/health").json()["status"] == "ok"


def test_a_field_named_like_a_keyword_is_a_field():
    schema = {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "$ref": {"type": "integer"}},
        "required": ["pattern"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with serve(ReplayEngine(['{"pattern": "a+", "$ref": 1}'])) as url:
        answer = ask(url, [user("x")], response_format=fmt).choices[0]
    assert json.loads(answer.message.content) == {"pattern": "a+", "$ref": 1}


def test_a_huge_tools_list_counts_against_the_prompt_limit():
    tools = [
        {"type": "function", "function": {"name": f"t{i}", "description": "word " * 2000, "parameters": {}}}
        for i in range(20)
    ]
    engine = EchoEngine()
    with serve(engine, max_prompt_tokens=5000) as url:
        r = post(url, {"messages": [user("x")], "tools": tools})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert engine.sessions == []  # refused before any engine work
