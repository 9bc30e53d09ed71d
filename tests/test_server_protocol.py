"""Pure pieces of the server: request parsing into turns, the content fingerprint, the stop hold-back."""

from __future__ import annotations

import json

import pytest

from qvl_agent.image import Screenshot
from qvl_agent.server.pool import fingerprint
from qvl_agent.server.protocol import MAX_STOP_CHARS, ApiError, parse_chat_request


def parse(body: dict, max_tokens: int = 64):
    return parse_chat_request(json.dumps(body).encode(), max_tokens)


def test_messages_become_history_turns_and_a_last_question():
    chat = parse(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "first"},
                {"role": "user", "content": [{"type": "text", "text": "second part"}]},
                {"role": "assistant", "content": "reply one"},
                {"role": "user", "content": "now this"},
            ],
            "max_tokens": 7,
            "temperature": 0.5,
            "stop": "END",
        }
    )
    assert chat.system == "Be brief."
    assert [(t.text, t.reply) for t in chat.history] == [("first\nsecond part", "reply one")]
    assert chat.text == "now this" and chat.images == ()
    assert chat.options.max_new_tokens == 7 and chat.options.temperature == 0.5 and chat.stop == ("END",)
    assert parse({"messages": [{"role": "user", "content": "x"}]}).options.max_new_tokens == 64


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": "x" * (MAX_STOP_CHARS + 1)}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": True}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": 1}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "top_k": -1}, "top_k"),
        ({"messages": [{"role": "user", "content": "x"}], "min_tokens": -1}, "min_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "min_tokens": 2.5}, "min_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "min_tokens": "8"}, "min_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8, "min_tokens": 9}, "min_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "min_tokens": 65}, "min_tokens"),  # over the default 64
        ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": ""}, {"role": "user", "content": "x"}]}, "messages[0].content"),
    ],
)
def test_bad_fields_name_the_parameter(body, param):
    with pytest.raises(ApiError) as err:
        parse(body)
    assert err.value.status == 400 and err.value.param == param


def test_min_tokens_reaches_the_generation_options_up_to_max_tokens():
    ask = {"messages": [{"role": "user", "content": "x"}]}
    assert parse(ask).options.min_new_tokens == 0  # left out (or null): end tokens end the reply as usual
    assert parse(ask | {"min_tokens": None}).options.min_new_tokens == 0
    assert parse(ask | {"min_tokens": 0, "max_tokens": 1}).options.min_new_tokens == 0
    same = parse(ask | {"min_tokens": 256, "max_tokens": 256}).options
    assert (same.min_new_tokens, same.max_new_tokens) == (256, 256)
    assert parse(ask | {"min_tokens": 5, "max_completion_tokens": 5}).options.min_new_tokens == 5
    assert parse(ask | {"min_tokens": 64}).options.min_new_tokens == 64  # the server's default max_tokens


def test_a_min_tokens_over_max_tokens_is_one_sentence_naming_both():
    with pytest.raises(ApiError) as err:
        parse({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8, "min_tokens": 9})
    assert err.value.message == "min_tokens must be at most max_tokens (8), not 9."
    with pytest.raises(ApiError) as err:
        parse({"messages": [{"role": "user", "content": "x"}], "min_tokens": 65})
    assert err.value.message == "min_tokens must be at most max_tokens (64, this server's default), not 65."
    with pytest.raises(ApiError) as err:
        parse({"messages": [{"role": "user", "content": "x"}], "min_tokens": -1})
    assert err.value.message == "min_tokens input should be greater than or equal to 0, not -1."


def test_fingerprint_covers_text_images_replies_and_shape():
    a = Screenshot(bytes(12), 2, 2, "RGB")
    b = Screenshot(bytes(12), 4, 1, "RGB")  # the same bytes in another shape is another image
    base = fingerprint("sys", [("q", [a], "r")])
    assert base == fingerprint("sys", [("q", [Screenshot(bytes(12), 2, 2, "RGB")], "r")])
    assert base != fingerprint("sys", [("q", [b], "r")])
    assert base != fingerprint("sys", [("q", [a], "r2")])
    assert base != fingerprint(None, [("q", [a], "r")])
    assert base != fingerprint("sys", [("q", [], "r")])


def test_sampling_fields_reach_the_generation_options():
    chat = parse({"messages": [{"role": "user", "content": "x"}], "top_k": 20, "presence_penalty": 1.5, "top_p": 0.8})
    assert (chat.options.top_k, chat.options.presence_penalty, chat.options.top_p) == (20, 1.5, 0.8)


def test_the_worker_holds_back_a_stop_string_split_across_pieces_with_the_engines_stream():
    from qvl_agent.engine.decode import TextStream
    from qvl_agent.server.worker import _PieceTokenizer

    tokens = _PieceTokenizer()
    f = TextStream(tokens, ("</end>",))
    out = [tokens.push(f, p) for p in ["Hello", " wor", "ld</e", "nd> more"]]
    assert "".join(out) == "Hello world" and f.stopped
    tokens = _PieceTokenizer()
    g = TextStream(tokens, ("</end>",))
    assert "".join(tokens.push(g, p) for p in ["a</e", "x b"]) + g.flush() == "a</ex b" and not g.stopped


def test_a_streamed_reply_gives_the_same_calls_however_it_is_cut():
    import random

    from qvl_agent.server.tools import ToolCallStream, parse_reply

    def call(text: str) -> str:
        return '<tool_call>\n{"name": "click", "arguments": {"text": "' + text + '"}}\n</tool_call>'

    broken = "<tool_call>\nnot json\n</tool_call>"
    reply = "Clicking.\n" + call("a <b> here") + "\n" + call("<tool_ and </tool") + " done"
    rng = random.Random(0)
    for text in (reply, "plain <tool_ text", broken, "<tool_call>\n{unfinished"):
        whole_content, whole_calls = parse_reply(text, frozenset({"click"}))
        for _ in range(30):
            stream, deltas, i = ToolCallStream(frozenset({"click"})), [], 0
            while i < len(text):
                n = rng.randint(1, 9)
                deltas += stream.push(text[i : i + n])
                i += n
            deltas += stream.flush()
            content = "".join(d.get("content", "") for d in deltas)
            heads = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
            args = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d]
            assert [h["function"]["name"] for h in heads] == [c.name for c in whole_calls]
            assert [a for a in args if a] == [c.arguments for c in whole_calls]
            if whole_calls:
                assert content.strip() == (whole_content or "").replace("\n\n", "\n")
            else:
                assert content == text == whole_content
