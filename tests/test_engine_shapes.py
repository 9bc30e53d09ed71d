"""The engine on the tiny models of each family's shape (tiny-4b: a wider text model, four query heads
per KV head, three DeepStack taps; tiny-8b: an untied output head and a wider vision tower): its greedy
tokens and first-token logits agree with plain transformers' `generate` on the same prompt."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

from qvl_agent.config import Settings
from qvl_agent.devtools.bench import QUESTION, Baseline
from qvl_agent.devtools.tiny_model import save_random_model
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.qwen3vl import Qwen3VLEngine
from qvl_agent.image import Screenshot


@pytest.mark.parametrize("shape", ["tiny-4b", "tiny-8b"])
def test_the_engine_agrees_with_plain_transformers_on_each_family_shape(tmp_path, shape):
    path = save_random_model(tmp_path / shape, shape)
    engine = Qwen3VLEngine.load(str(path), device="cpu", settings=Settings(compile=False))
    shot = Screenshot(bytes(range(256)) * (96 * 64 * 3 // 256), 96, 64, "RGB")
    png = shot.to_png()
    session = engine.open_session([shot])
    session.complete(QUESTION, options=GenerationOptions(max_new_tokens=16, min_new_tokens=16))
    ids = session.context.ids[session.last_stats.prompt_tokens :]
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    assert model.config.tie_word_embeddings is (shape != "tiny-8b")
    base = Baseline(model, AutoProcessor.from_pretrained(str(path)), torch.device("cpu"))
    _, reference = base.generate([(png, QUESTION, None)], 16)
    assert ids == reference.tolist()
    # Follow-up on the same screenshot: the vision tower does not run again.
    session.complete("And the title?", options=GenerationOptions(max_new_tokens=4))
    assert session.last_stats.vision in ("hit", "none")
    engine.close()
