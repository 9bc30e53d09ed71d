"""Randomly initialised Qwen3-VL models with a locally trained tokenizer: the tiny model the tests load
and the real 2B shape the benchmark times (latency does not depend on the weights' values).

Everything here is saved with `save_pretrained` and loaded back through the same code path as real
weights (`Qwen3VLEngine.load`). The tokenizer is a byte-level BPE trained on a small built-in corpus and
carries Qwen's special tokens; the chat template is Qwen3-VL's own, less video. A shape whose vocabulary is
wider than that (the real 2B's 151,936 ids) gets the tokenizer widened to match: every id the model can
pick then has text, as with the official tokenizer, so a streamed reply streams and its text can be
compared. Real weights bring the official tokenizer and template instead.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Not special in Qwen's vocabulary (they must survive skip_special_tokens), but single tokens.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen3-VL-2B-Instruct's own chat template (its chat_template.json), less video and the optional
# "Picture N:" labels: the system prompt with the tools in hermes form, user turns with images, assistant
# turns with their tool calls, and consecutive tool results joined in one user turn.
CHAT_TEMPLATE = """\
{%- macro render(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif 'text' in part -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render(messages[0].content) + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with \
function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' + render(message.content) }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

_CORPUS = """\
The screen shows a window with a title bar, a menu, buttons and text fields. Click the button labelled OK.
What is on this screen? It looks like a settings dialog with a checkbox and a Save button at the bottom.
<tool_call>
{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [512, 384]}}
</tool_call>
{"action": "type", "text": "hello world"} {"action": "key", "keys": ["ctrl", "s"]} scroll pixels -300
{"bbox_2d": [120, 40, 360, 88], "label": "Search field"} {"point_2d": [500, 500]} terminate success failure
Thought: I need to open the File menu first. Action: click File. The answer is 42. Yes, no, maybe.
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000 , . : ; ! ? ( ) [ ] { } " '
"""


def build_tokenizer(vocab_size: int = 1024, total: int | None = None):
    """A byte-level BPE tokenizer with Qwen's special tokens, trained here in well under a second.

    `total` widens it to that many ids (the model's vocabulary): ids past the trained ones become short
    lowercase words that no merge produces, so encoding is unchanged and every id decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    if total is not None:
        tok = _widened(tok, total - len(ADDED_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.add_tokens(ADDED_TOKENS)
    return fast


def _widened(tok, size: int):
    """`tok` with its BPE vocabulary filled up to `size` ids by filler words (no merges lead to them)."""
    import itertools
    import string

    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    # "Ġ" is byte-level BPE's space: half the fillers start a word, so a random reply reads as words.
    words = (
        prefix + "".join(letters)
        for n in (2, 3, 4)
        for letters in itertools.product(string.ascii_lowercase, repeat=n)
        for prefix in ("Ġ", "")
    )
    for word in words:
        if len(vocab) >= size:
            break
        vocab.setdefault(word, len(vocab))
    return Tokenizer.from_str(json.dumps(data))


def build_processor(tokenizer=None):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer = tokenizer or build_tokenizer()
    image_processor = Qwen2VLImageProcessor(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": 65_536, "longest_edge": 16_777_216},
    )
    video_processor = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def _token_ids(tokenizer) -> dict:
    ids = {
        t: tokenizer.convert_tokens_to_ids(t)
        for t in (
            "<|image_pad|>",
            "<|video_pad|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|im_end|>",
            "<|endoftext|>",
        )
    }
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad": ids["<|endoftext|>"],
    }


def _qwen3vl_config(tokenizer, text: dict, vision: dict, mrope_section: list[int], tied: bool = True, **extra):
    """A Qwen3-VL config with the parts every shape shares: interleaved M-RoPE at theta 5e6, patch 16,
    merge 2, T=2, and this tokenizer's special-token ids; embeddings tied (2B, 4B) or not (8B)."""
    from transformers import Qwen3VLConfig

    ids = _token_ids(tokenizer)
    rope = {
        "rope_type": "default",
        "rope_theta": 5_000_000.0,
        "mrope_section": mrope_section,
        "mrope_interleaved": True,
    }
    return Qwen3VLConfig(
        text_config=dict(
            text, rope_parameters=rope, eos_token_id=ids["eos"], pad_token_id=ids["pad"], bos_token_id=ids["pad"]
        ),
        vision_config=dict(vision, patch_size=16, spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["image_token_id"],
        video_token_id=ids["video_token_id"],
        vision_start_token_id=ids["vision_start_token_id"],
        vision_end_token_id=ids["vision_end_token_id"],
        tie_word_embeddings=tied,
        **extra,
    )


def tiny_config(tokenizer):
    """A few-MB Qwen3-VL: the real architecture (DeepStack, interleaved M-RoPE), tiny widths."""
    return _qwen3vl_config(
        tokenizer,
        text=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
            initializer_range=0.3,  # wide random weights: greedy decoding then wanders instead of repeating
        ),
        vision=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
            num_position_embeddings=256, deepstack_visual_indexes=[0, 1], initializer_range=0.3,
        ),
        mrope_section=[4, 2, 2],
    )  # fmt: skip


def tiny_4b_config(tokenizer):
    """The tiny model with what sets the 4B apart from the 2B: more layers, a wider text model than the
    vision tower's output would be in the 2B, four query heads per KV head. Tied embeddings, as the 4B."""
    return _qwen3vl_config(
        tokenizer,
        text=dict(
            vocab_size=len(tokenizer), hidden_size=80, intermediate_size=160, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
            initializer_range=0.3,
        ),
        vision=dict(
            depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=80,
            num_position_embeddings=256, deepstack_visual_indexes=[0, 1, 2], initializer_range=0.3,
        ),
        mrope_section=[4, 2, 2],
    )  # fmt: skip


def tiny_8b_config(tokenizer):
    """The tiny model with what sets the 8B apart: an untied output head, a wider vision tower with its own
    head count, DeepStack taps deeper in it, four query heads per KV head."""
    return _qwen3vl_config(
        tokenizer,
        text=dict(
            vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
            initializer_range=0.3,
        ),
        vision=dict(
            depth=4, hidden_size=48, intermediate_size=96, num_heads=3, out_hidden_size=96,
            num_position_embeddings=256, deepstack_visual_indexes=[1, 2, 3], initializer_range=0.3,
        ),
        mrope_section=[4, 2, 2],
        tied=False,
    )  # fmt: skip


SHAPES = {"tiny": tiny_config, "tiny-4b": tiny_4b_config, "tiny-8b": tiny_8b_config}  # the 2B's added below


def qwen3vl_2b_config(tokenizer):
    """The real Qwen3-VL-2B-Instruct shape (DESIGN.md), with this tokenizer's special-token ids."""
    return _qwen3vl_config(
        tokenizer,
        text=dict(
            vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=262_144,
            dtype="bfloat16",
        ),
        vision=dict(
            depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
            num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
        ),
        mrope_section=[24, 20, 20],
        dtype="bfloat16",
    )  # fmt: skip


SHAPES["2b"] = qwen3vl_2b_config


def random_model_parts(shape: str, vocab_size: int | None = None):
    """(processor, config) of a random Qwen3-VL of `shape` (a key of SHAPES); `vocab_size` overrides the
    shape's vocabulary. The tokenizer is widened to the model's vocabulary where that is larger."""
    processor = build_processor()
    config = SHAPES[shape](processor.tokenizer)
    if vocab_size is not None:
        config.text_config.vocab_size = vocab_size
    wanted = config.text_config.vocab_size
    if wanted > len(processor.tokenizer):
        processor = build_processor(build_tokenizer(total=wanted))
        config = SHAPES[shape](processor.tokenizer)
        config.text_config.vocab_size = wanted
    return processor, config


def save_random_model(path: str | Path, shape: str = "tiny", seed: int = 0, vocab_size: int | None = None) -> Path:
    """Build a random Qwen3-VL of `shape` (a key of SHAPES) and save model + processor to `path`;
    `vocab_size` overrides the shape's vocabulary (the tiny model with the real 2B's 151,936 ids)."""
    import torch
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    processor, config = random_model_parts(shape, vocab_size)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    ids = _token_ids(processor.tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=ids["eos"], pad_token_id=ids["pad"], do_sample=False)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    (path / "qvl_model.json").write_text(json.dumps({"random_weights": True, "shape": shape, "seed": seed}) + "\n")
    return path
