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


def test_top_k_and_presence_penalty_shape_what_sampling_can_pick():
    import torch

    from qvl_agent.engine.base import GenerationOptions
    from qvl_agent.engine.decode import select_token

    logits = torch.tensor([[5.0, 4.9, 4.8, -1.0, -2.0]])
    gen = torch.Generator().manual_seed(0)
    picks = {int(select_token(logits, 1.0, 1.0, gen, top_k=2)) for _ in range(200)}
    assert picks == {0, 1}  # never outside the two most likely
    seen = torch.tensor([0, 1])
    picks = {int(select_token(logits, 1.0, 1.0, gen, top_k=1, presence_penalty=50.0, seen=seen)) for _ in range(50)}
    assert picks == {2}  # the tokens already said are pushed below the next one
    assert int(select_token(logits, 0.0, 1.0, top_k=2, presence_penalty=50.0, seen=seen)) == 0  # greedy ignores both
    recipe = GenerationOptions.sampling()
    assert (recipe.temperature, recipe.top_p, recipe.top_k, recipe.presence_penalty) == (0.7, 0.8, 20, 1.5)
    assert GenerationOptions().temperature == 0 and GenerationOptions.sampling(max_new_tokens=9).max_new_tokens == 9


def test_frequency_penalty_grows_with_each_repeat_of_a_token():
    import torch

    from qvl_agent.engine.decode import select_token

    logits = torch.tensor([[5.0, 4.0, 3.5, -1.0]])
    gen = torch.Generator().manual_seed(0)
    once, thrice = torch.tensor([0, 1]), torch.tensor([0, 0, 0, 1])

    def pick(seen):
        return {int(select_token(logits, 1.0, 1.0, gen, top_k=1, frequency_penalty=1.0, seen=seen)) for _ in range(20)}

    assert pick(once) == {0}  # 5 - 1 is still above 4 - 1 and 3.5
    assert pick(thrice) == {2}  # 5 - 3 and 4 - 1 fall below 3.5
    assert int(select_token(logits, 0.0, 1.0, frequency_penalty=9.0, seen=thrice)) == 0  # greedy takes the top


def test_drafts_come_from_the_tool_call_skeleton_and_earlier_context(tokenizer):
    from qvl_agent.engine.speculate import Drafter, skeleton_ids

    context = tokenizer.encode("Click the blue Save button now. The blue Save", add_special_tokens=False)
    drafter = Drafter(context, skeleton_ids(tokenizer))
    follow = tokenizer.decode(drafter.propose(4))
    assert follow.startswith(" button")  # prompt lookup: what followed the same words before
    drafter.extend(tokenizer.encode(" button.\n<tool_call>", add_special_tokens=False))
    assert tokenizer.decode(drafter.propose(15)).startswith('\n{"name": "computer_use"')
