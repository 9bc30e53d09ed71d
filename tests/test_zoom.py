"""Zoom-in grounding: a second pass on a crop around the first answer, mapped back to the screen.

The published procedure is ClawGUI-Eval's (ZJU-REAL/ClawGUI@d990d3e3f2390ced708771d9681d3c4f9a6cbef5,
clawgui-eval/inference/seed_inferencer.py `_crop_and_zoom` and `_map_zoomed_to_original`, after the MAI-UI
blog): a crop of a fraction of each side centred on the first 0-1000 point, shifted (not shrunk) to stay
inside the image, cut at whole pixels, and the crop's 0-1000 answer mapped back as
`left + z / 1000 * crop_width`. `published_*` below restate it as the oracle.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from qvl_agent import profiles
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.grounding import Zoom, locate, system_prompt, user_text
from qvl_agent.image import Region, Screenshot, zoom_region
from tests.conftest import run_cli


def published_crop(w: int, h: int, x: float, y: float, ratio: float) -> tuple[float, float, float, float]:
    cx, cy, cw, ch = x / 1000 * w, y / 1000 * h, w * ratio, h * ratio
    left, top, right, bottom = cx - cw / 2, cy - ch / 2, cx + cw / 2, cy + ch / 2
    if left < 0:
        right -= left
        left = 0
    if top < 0:
        bottom -= top
        top = 0
    if right > w:
        left -= right - w
        right = w
    if bottom > h:
        top -= bottom - h
        bottom = h
    return max(0, left), max(0, top), min(w, right), min(h, bottom)


def published_map_back(zx: float, zy: float, crop: tuple[float, float, float, float]) -> tuple[float, float]:
    left, top, right, bottom = crop
    return zx / 1000 * (right - left) + left, zy / 1000 * (bottom - top) + top


def patterned(width: int, height: int, left: int = 0, top: int = 0) -> Screenshot:
    # Every pixel differs from its neighbours, so a crop one pixel off shows in its hash.
    y, x, c = np.ogrid[:height, :width, :3]  # byte (y, x, c) is (7x + 13y + c) mod 256
    data = ((x * 7 + y * 13 + c) % 256).astype(np.uint8).tobytes()
    return Screenshot(data, width, height, "RGB", left=left, top=top)


def test_a_crop_is_the_pixels_of_its_region_and_knows_where_it_lies():
    shot = patterned(40, 30, left=-1920, top=100)
    crop = shot.crop(Region(-1910, 105, 20, 15))
    assert crop.size == (20, 15) and (crop.left, crop.top) == (-1910, 105)
    assert crop.to_pil().tobytes() == shot.to_pil().crop((10, 5, 30, 20)).tobytes()


CASES = [
    # width, height, first point, crop fraction, the crop's answer
    (3840, 2160, (900, 100), 0.5, (333, 667)),
    (3840, 2160, (500, 500), 0.25, (10, 990)),
    (3840, 2160, (0, 1000), 0.5, (1000, 0)),
    (2560, 1440, (123, 456), 0.5, (789, 12)),
    (1366, 768, (999, 1), 0.25, (500, 500)),
    (3841, 2161, (777, 333), 0.5, (250, 750)),
]


@pytest.mark.parametrize("w, h, first, fraction, second", CASES)
def test_the_crop_and_the_mapped_back_point_follow_the_published_procedure(w, h, first, fraction, second):
    shot = Screenshot(b"\0\0\0" * (w * h), w, h, "RGB", left=1920, top=-300)
    region = zoom_region(*first, shot, fraction)
    left, top, right, bottom = published_crop(w, h, *first, fraction)
    assert (region.left - 1920, region.top + 300) == (int(left), int(top))
    assert (region.width, region.height) == (int(right) - int(left), int(bottom) - int(top))
    engine = ReplayEngine([f"[{first[0]},{first[1]}]", f"[{second[0]},{second[1]}]"])
    engine.profile = profiles.get("ui-venus-1.5")
    found = locate(engine, shot, "the Save button", zoom=Zoom("always", crop=fraction))
    # The crop as cut starts at the whole pixel int(left); the answer lies there, within one pixel.
    cut = (int(left), int(top), int(right), int(bottom))
    px, py = published_map_back(*second, cut)
    assert abs(found.x - 1920 - px) <= 1 and abs(found.y + 300 - py) <= 1
    # The published map-back adds the unrounded left edge (a sub-pixel slip of its own): under two pixels apart.
    qx, qy = published_map_back(*second, (left, top, right, bottom))
    assert abs(found.x - 1920 - qx) < 2 and abs(found.y + 300 - qy) < 2
    assert found.passes == 2 and found.first == first


@pytest.mark.parametrize("name", list(profiles.PROFILES))
def test_a_4k_screen_sends_the_published_first_and_second_requests(name):
    profile = profiles.get(name)
    answers = {
        "ui-venus-1.5": ("[900,100]", "[333,667]"),
        "mai-ui": tuple(f'<grounding_think>x</grounding_think><answer>{{"coordinate": [{p}]}}</answer>'
                        for p in ("900,100", "333,667")),
        "gui-owl-1.5": tuple(f'<tool_call>\n{{"name": "computer_use", "arguments": {{"action": "left_click", '
                             f'"coordinate": [{p}]}}}}\n</tool_call>' for p in ("900, 100", "333, 667")),
        "qwen3-vl": tuple(f'<tool_call>\n{{"name": "computer_use", "arguments": {{"action": "left_click", '
                          f'"coordinate": [{p}]}}}}\n</tool_call>' for p in ("900, 100", "333, 667")),
    }[name]  # fmt: skip
    shot = patterned(3840, 2160)
    engine = ReplayEngine(list(answers))
    engine.profile = profile
    found = locate(engine, shot, "the Save button.", zoom=Zoom("always", crop=0.5))
    first, second = engine.requests
    for request in (first, second):
        assert request.system == system_prompt(profile)
        assert request.text == user_text("the Save button.", profile)
        assert request.text_first is profile.text_first
    assert first.image_sizes == [(3840, 2160)] and first.image_hashes == [shot.content_hash]
    # Centred on (3456, 216), shifted inside: x 1920-3840, y 0-1080.
    assert second.image_sizes == [(1920, 1080)]
    assert second.image_hashes == [shot.crop(Region(1920, 0, 1920, 1080)).content_hash]
    assert abs(found.x - (0.333 * 1920 + 1920)) <= 1 and abs(found.y - 0.667 * 1080) <= 1


def test_zoom_when_large_only_zooms_screens_above_the_size_and_unsure_when_samples_disagree():
    venus = profiles.get("ui-venus-1.5")
    small, large = (
        Screenshot(b"\0" * 3 * 1920 * 1080, 1920, 1080, "RGB"),
        Screenshot(b"\0" * 3 * 3840 * 2160, 3840, 2160, "RGB"),
    )
    for shot, asked in ((small, 1), (large, 2)):
        engine = ReplayEngine(["[500,500]", "[500,500]"])
        engine.profile = venus
        locate(engine, shot, "OK", zoom=Zoom("large"))
        assert len(engine.requests) == asked
    # unsure: two sampled answers after the greedy one; they agree, so no crop.
    engine = ReplayEngine(["[500,500]", "[505,498]", "[497,503]"])
    engine.profile = venus
    assert locate(engine, small, "OK", zoom=Zoom("unsure")).passes == 1 and len(engine.requests) == 3
    engine = ReplayEngine(["[500,500]", "[505,498]", "[100,900]", "[500,500]"])
    engine.profile = venus
    assert locate(engine, small, "OK", zoom=Zoom("unsure")).passes == 2
    assert engine.requests[-1].image_sizes == [(960, 540)]


def test_when_the_crop_names_no_point_the_first_answer_stands():
    engine = ReplayEngine(["[900,100]", "[-1,-1]"])
    engine.profile = profiles.get("ui-venus-1.5")
    found = locate(engine, patterned(200, 100), "OK", zoom=Zoom("always"))
    assert (found.x, found.y) == (180, 10) and found.passes == 2


def test_locate_zoom_on_a_4k_screenshot_from_the_command_line(tmp_path):
    image = tmp_path / "screen.png"
    patterned(3840, 2160).to_pil().save(image)
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["[900,100]", "[333,667]"]))
    done = run_cli("locate", "--image", str(image), "--zoom", "--json", "--profile", "ui-venus-1.5",
                   "--engine", f"replay:{replies}", "the Save button")  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["x"], answer["y"]) == (2559, 720) and answer["passes"] == 2 and answer["first"] == [900, 100]
    replies.write_text(json.dumps(["[-1,-1]"]))
    refused = run_cli("locate", "--image", str(image), "--profile", "ui-venus-1.5",
                      "--engine", f"replay:{replies}", "the purple elephant")  # fmt: skip
    assert refused.returncode == 1 and refused.stdout == ""
    assert (
        refused.stderr.strip() == "qvl-agent: The model (UI-Venus-1.5) says 'the purple elephant' is not on the screen."
    )


def test_eval_screenspot_with_zoom_reports_both_figures_side_by_side(tmp_path):
    """Two items on a 3840x2160 screen: the first pass misses the small icon and the crop finds it; the
    button is hit either way. Replies in UI-Venus's format, in the order they are asked."""
    (tmp_path / "images").mkdir()
    patterned(384, 216).to_pil().resize((3840, 2160)).save(tmp_path / "images" / "screen.png")
    items = [
        {"img_filename": "screen.png", "bbox": [3000, 200, 40, 40], "instruction": "the gear icon",
         "data_type": "icon", "data_source": "windows"},
        {"img_filename": "screen.png", "bbox": [400, 1000, 400, 100], "instruction": "the OK button",
         "data_type": "text", "data_source": "windows"},
    ]  # fmt: skip
    data = tmp_path / "screenspot_desktop_v2.json"
    data.write_text(json.dumps(items))
    # Icon centre (3020, 220): first pass says (3060, 260) = [797, 120], off by 40 px; the crop (1920-3840,
    # 0-1080) answers [573, 204] = (3020, 220). Button centre (600, 1050) = [156, 486]; its crop (0-1920,
    # 510-1590) answers [312, 500].
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["[797,120]", "[573,204]", "[156,486]", "[312,500]"]))
    out = tmp_path / "out"
    done = run_cli("eval", "screenspot", str(data), "--zoom", "--profile", "ui-venus-1.5",
                   "--engine", f"replay:{replies}", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ScreenSpot (ScreenSpot/v2): accuracy 100.00% (2/2) with zoom, 50.00% (1/2) without"
    assert "  type=icon: 100.00% (1/1) with zoom, 0.00% (0/1) without" in lines
    assert "  type=text: 100.00% (1/1) with zoom, 100.00% (1/1) without" in lines
    assert any(line.startswith("latency per click with zoom: median") for line in lines)
    assert any(line.startswith("latency per click without zoom: median") for line in lines)
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["hit"], r["single_hit"]) for r in results] == [(True, False), (True, True)]
    assert "<th>profile</th><td>ui-venus-1.5</td>" in (out / "report.html").read_text()


def test_bad_zoom_and_profile_settings_are_one_sentence(tmp_path):
    env = {"QVL_CONFIG_DIR": str(tmp_path / "config")}
    bad = run_cli("locate", "--image", "x.png", "OK", env={**env, "QVL_ZOOM": "sometimes"})
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        == "qvl-agent: zoom must be one of off, always, large, unsure, not 'sometimes' (in $QVL_ZOOM)."
    )
    crop = run_cli("locate", "--image", "x.png", "--zoom-crop", "95", "OK", env=env)
    assert crop.returncode == 2 and "zoom_crop must be a percentage from 10 to 90, not 95." in crop.stderr
    profile = run_cli("models", env={**env, "QVL_PROFILE": "venus"})
    assert (
        profile.returncode == 2
        and "profile must be one of ui-venus-1.5, mai-ui, gui-owl-1.5, qwen3-vl" in profile.stderr
    )
    flag = run_cli("locate", "--image", "x.png", "--profile", "venus", "OK", env=env)
    assert flag.returncode == 2 and "Traceback" not in flag.stderr and len(flag.stderr.strip().splitlines()) == 1
