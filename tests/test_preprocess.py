"""Our torch preprocessing must give the reference processor's pixel_values exactly."""

import numpy as np
import pytest
import torch
from PIL import Image

from qvl_agent.engine.preprocess import PreprocessSettings, preprocess, visual_tokens
from qvl_agent.image import Screenshot, load_image


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


def _bgra(rgb: np.ndarray) -> np.ndarray:
    alpha = np.zeros(rgb.shape[:2] + (1,), np.uint8)  # mss gives alpha 0
    return np.concatenate([rgb[..., ::-1], alpha], axis=-1)


@pytest.mark.parametrize(
    "width,height",
    [(1920, 1080), (200, 120), (1366, 768), (3001, 17), (17, 900), (64, 64), (4000, 3000)],
    ids=["1080p", "upscale", "odd-1366", "wide-strip", "tall-strip", "tiny", "downscale-12mp"],
)
def test_matches_reference_processor(processor, width, height, tmp_path):
    rng = np.random.default_rng(width * height)
    rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    ref = processor.image_processor(images=[Image.fromarray(rgb)], return_tensors="pt")
    settings = PreprocessSettings.from_processor(processor.image_processor)
    path = tmp_path / "shot.png"
    Image.fromarray(rgb).save(path)
    sources = {
        "bgra": Screenshot.from_array(_bgra(rgb), "BGRA"),
        "rgb": Screenshot.from_array(rgb),
        "pil": Screenshot.from_pil(Image.fromarray(rgb)),
        "file": load_image(path),
    }
    for name, shot in sources.items():
        pixel_values, grid = preprocess(shot, settings)
        assert torch.equal(grid, ref["image_grid_thw"]), name
        assert torch.equal(pixel_values, ref["pixel_values"]), name
    assert visual_tokens(sources["rgb"], settings) == ref["pixel_values"].shape[0] // 4


def test_1080p_screenshot_is_2040_visual_tokens(processor):
    settings = PreprocessSettings.from_processor(processor.image_processor)
    shot = Screenshot(bytes(1920 * 1080 * 4), 1920, 1080, "BGRA")
    assert visual_tokens(shot, settings) == 2040


def test_pixel_cap_shrinks_what_the_model_sees(processor):
    capped = PreprocessSettings.from_processor(processor.image_processor, max_pixels=1_000_000)
    shot = Screenshot(bytes(3840 * 2160 * 4), 3840, 2160, "BGRA")
    assert visual_tokens(shot, capped) * 4 * 16 * 16 <= 1_000_000
