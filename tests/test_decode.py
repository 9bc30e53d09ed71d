"""Streaming text from generated ids: pieces add up to the reply, nothing past a stop string shows."""

import pytest

from qvl_agent.engine.decode import TextStream


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _stream(tokenizer, ids, stop=()):
    stream = TextStream(tokenizer, stop)
    pieces = []
    for token in ids:
        pieces.append(stream.push(token))
        if stream.stopped:
            break
    pieces.append(stream.flush())
    return "".join(pieces), stream


def test_pieces_add_up_to_the_whole_reply_with_multibyte_characters(tokenizer):
    text = "Größe: 42 € — click “Save” 保存 now. " * 20
    ids = tokenizer.encode(text, add_special_tokens=False)
    shown, stream = _stream(tokenizer, ids)
    assert shown == stream.text() == tokenizer.decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in shown


def test_nothing_past_a_stop_string_is_shown(tokenizer):
    ids = tokenizer.encode("The answer is 42. STOP and then more text", add_special_tokens=False)
    shown, stream = _stream(tokenizer, ids, stop=("STOP",))
    assert stream.stopped and shown == "The answer is 42. "
