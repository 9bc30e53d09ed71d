"""`--model DIR` of each family picks its profile, on the command line and on the real transformers path
with the tiny random Qwen3-VL (its files laid out under each family's checkpoint name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qvl_agent.config import Settings
from qvl_agent.engine import open_engine
from qvl_agent.engine.remote import RemoteEngine
from qvl_agent.errors import ParseError
from qvl_agent.grounding import locate, system_prompt, user_text
from qvl_agent.image import Screenshot
from qvl_agent.profiles import get
from tests.conftest import run_cli

CLICK = (
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [250, 500]}}\n'
    "</tool_call>"
)
FAMILIES = [
    # checkpoint folder, profile, a reply in that model's own format naming the grid point (250, 500)
    ("UI-Venus-1.5-2B", "ui-venus-1.5", "[250,500]"),
    ("MAI-UI-2B", "mai-ui", '<grounding_think>Left.</grounding_think>\n<answer>\n{"coordinate": [250,500]}\n</answer>'),
    ("GUI-Owl-1.5-2B-Instruct", "gui-owl-1.5", CLICK),
    ("Qwen3-VL-2B-Instruct", "qwen3-vl", CLICK),
]


def checkpoint(tiny_model_dir: Path, root: Path, name: str) -> Path:
    """The tiny model's files under a family's checkpoint name, as a download would lay them out."""
    folder = root / name
    if not folder.exists():
        folder.mkdir(parents=True)
        for f in tiny_model_dir.iterdir():
            (folder / f.name).symlink_to(f)
    return folder


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "screen.png"
    Screenshot(bytes([40, 80, 120]) * (400 * 200), 400, 200, "RGB").to_pil().save(path)
    return path


@pytest.mark.parametrize("folder, name, reply", FAMILIES, ids=[f[1] for f in FAMILIES])
def test_model_dir_of_each_family_picks_its_profile_and_reads_its_format(tiny_model_dir, tmp_path, image, folder,
                                                                        name, reply):  # fmt: skip
    model = checkpoint(tiny_model_dir, tmp_path, folder)
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([reply]))
    done = run_cli("locate", "--image", str(image), "--model", str(model), "--engine", f"replay:{replies}", "OK")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["100", "100"]
    profile = get(name)
    assert done.stderr == f"qvl-agent: using the {name} profile ({profile.title}), chosen from its folder name.\n"


def test_an_unknown_qwen3vl_checkpoint_says_it_gets_the_instruct_profile(tiny_model_dir, tmp_path, image):
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([FAMILIES[-1][2]]))
    done = run_cli("locate", "--image", str(image), "--model", str(tiny_model_dir), "--engine", f"replay:{replies}",
                   "OK")  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert "is a Qwen3-VL checkpoint of no known family: using the qwen3-vl profile (Qwen3-VL-Instruct)" in line


def test_the_local_engine_asks_mai_ui_text_first_within_its_pixel_budget(tiny_model_dir, tmp_path):
    model = checkpoint(tiny_model_dir, tmp_path, "MAI-UI-2B")
    shot = Screenshot(bytes([40, 80, 120]) * (320 * 240), 320, 240, "RGB")
    with open_engine(Settings(model=str(model), device="cpu", compile=False, speculative=False)) as engine:
        assert engine.profile.name == "mai-ui" and engine.pp.max_pixels == 6_553_600
        session = engine.open_session(system=system_prompt(engine.profile))
        session.text_first = True
        session.complete(user_text("the OK button", engine.profile), [shot])
        rendered = session.context.text
        question, vision = rendered.index("the OK button\n"), rendered.index("<|vision_start|>")
        assert rendered.index("## Input instruction") < question < vision  # system, then text, then image
        # The same ids through plain transformers give the same next-token logits.
        ids = session.context.ids[: session.last_stats.prompt_tokens]
        inputs = engine.processor.image_processor(images=[shot.to_pil()], return_tensors="pt")
        engine.model.model.rope_deltas = None
        input_ids = torch.tensor([ids])
        mm_types = (input_ids == engine.image_token_id).int()
        with torch.inference_mode():
            out = engine.model(input_ids=input_ids, pixel_values=inputs["pixel_values"],
                               image_grid_thw=inputs["image_grid_thw"], mm_token_type_ids=mm_types)  # fmt: skip
        reference = out.logits[0, -1]
        session.close()
        again = engine.open_session(system=system_prompt(engine.profile))
        again.text_first = True
        logits = []
        hook = engine.model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o[0, -1].clone()))
        try:
            again.complete(user_text("the OK button", engine.profile), [shot])
        finally:
            hook.remove()
            again.close()
        assert torch.allclose(logits[0], reference, atol=1e-4)
        # A random model's reply is not MAI-UI's format: one sentence, never a traceback.
        try:
            locate(engine, shot, "the OK button")
        except ParseError as exc:
            assert "\n" not in str(exc)


def test_an_openai_server_gets_the_profiles_order():
    session = RemoteEngine("http://127.0.0.1:9", model="m").open_session(system=system_prompt(get("mai-ui")))
    session.text_first = True
    shot = Screenshot(b"\0\0\0" * 4, 2, 2, "RGB")
    user = session.messages("the OK button\n", [shot])[-1]["content"]
    assert [part["type"] for part in user] == ["text", "image_url"] and user[0]["text"] == "the OK button\n"
