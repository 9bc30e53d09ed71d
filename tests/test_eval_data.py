"""Reading ScreenSpot-family data sets as they are published: both layouts, JSON and JSONL, images beside
the file, in images/ beside it or beside its folder, or in another folder beside it; bad data refused with
one sentence. Also `locate --screen` on the virtual display, and the latency figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from qvl_agent.errors import UsageError
from qvl_agent.eval.report import percentile
from qvl_agent.eval.screenspot import LAYOUT_PRO, LAYOUT_V2, load_dataset
from tests.conftest import run_cli


def _png(path: Path, size=(200, 100)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (10, 20, 30)).save(path)


def test_screenspot_v1_layout_with_its_image_folder_and_file_name_split(tmp_path):
    _png(tmp_path / "screenspot_imgs" / "a.png")
    (tmp_path / "screenspot_mobile.json").write_text(
        json.dumps(
            [
                {
                    "img_filename": "a.png",
                    "bbox": [10, 20, 30, 40],
                    "instruction": " tap it ",
                    "data_type": "icon",
                    "data_source": "ios",
                }
            ]
        )
    )
    (item,) = load_dataset(tmp_path)
    assert item.layout == LAYOUT_V2 and item.box == (10, 20, 40, 60)  # [x, y, w, h]
    assert item.instruction == "tap it" and item.splits == {"platform": "mobile", "type": "icon"}
    assert item.image == tmp_path / "screenspot_imgs" / "a.png" and item.id == "screenspot_mobile:1"
    assert item.contains(40, 60) and not item.contains(41, 60)


def test_pro_layout_as_jsonl_with_images_beside_the_annotations_folder(tmp_path):
    _png(tmp_path / "images" / "app" / "b.png")
    rows = [
        {
            "img_filename": "app/b.png",
            "bbox": [10, 20, 30, 40],
            "img_size": [200, 100],
            "instruction": "x",
            "ui_type": "text",
            "group": "CAD",
            "platform": "linux",
            "id": "b1",
        },
    ]
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "app.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "junk.json").write_text("{not json")  # a download's own files are not data
    (tmp_path / "dataset_info.json").write_text(json.dumps({"description": "metadata"}))
    (item,) = load_dataset(tmp_path)
    assert item.layout == LAYOUT_PRO and item.box == (10, 20, 30, 40)  # [x1, y1, x2, y2]
    assert item.splits == {"platform": "linux", "type": "text", "group": "CAD"} and item.id == "b1"
    assert load_dataset(tmp_path / "annotations" / "app.jsonl")[0].image == tmp_path / "images" / "app" / "b.png"


@pytest.mark.parametrize(
    "items, says",
    [
        ([{"img_filename": "a.png", "bbox": [1, 2, 3], "instruction": "x", "data_type": "text"}], "bbox must be"),
        ([{"img_filename": "zz.png", "bbox": [1, 2, 3, 4], "instruction": "x", "data_type": "text"}], "zz.png"),
        ([{"img_filename": "a.png", "bbox": [1, 2, 3, 4], "data_type": "text"}], "needs img_filename and instr"),
        ([{"img_filename": "a.png", "bbox": [1, 2, 3, 4], "instruction": "x"}], "neither ScreenSpot/v2"),
        ({"img_filename": "a.png"}, "must hold a list"),
    ],
)
def test_bad_data_is_refused_with_one_sentence(tmp_path, items, says):
    _png(tmp_path / "a.png")
    path = tmp_path / "data.json"
    path.write_text(json.dumps(items))
    with pytest.raises(UsageError, match=says):
        load_dataset(path)


def test_percentiles_are_nearest_rank():
    values = [5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert (percentile(values, 50), percentile(values, 90), percentile([], 50)) == (5.0, 9.0, 0.0)


@pytest.mark.display
def test_locate_on_the_screen_maps_the_grid_point_to_desktop_pixels(tmp_path, x_display):
    replies = tmp_path / "r.json"
    call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [250, 500]}}
    replies.write_text(json.dumps(["<tool_call>\n" + json.dumps(call) + "\n</tool_call>"]))
    done = run_cli("locate", "--screen", "--engine", f"replay:{replies}", "the middle left", env={"DISPLAY": x_display})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["480", "540"]  # a quarter across, half down a 1920x1080 screen


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("deep.json", "[" * 100_000, "nested too deeply"),
        ("big.json", '[{"bbox": [1' + "0" * 5000 + "]}]", "not usable JSON"),
        ("lines.jsonl", '{"img_filename": "a.png"}\n{broken\n', "lines.jsonl line 2 is not valid JSON"),
        (
            "bool.json",
            '[{"img_filename": "a.png", "bbox": [true, 2, 3, 4], "instruction": "x", "data_type": "t"}]',
            "bbox",
        ),
        (
            "nan.json",
            '[{"img_filename": "a.png", "bbox": [NaN, 2, 3, 4], "instruction": "x", "data_type": "t"}]',
            "bbox",
        ),
        (
            "neg.json",
            '[{"img_filename": "a.png", "bbox": [9, 2, -3, 4], "instruction": "x", "data_type": "t"}]',
            "negative",
        ),
        (
            "size.json",
            '[{"img_filename": "a.png", "bbox": [1, 2, 3, 4], "instruction": "x", "img_size": [0, 9]}]',
            "img_size",
        ),
        (
            "bad.json",
            '[{"img_filename": "bad.png", "bbox": [1, 2, 3, 4], "instruction": "x", "data_type": "t"}]',
            "bad.png",
        ),
    ],
)
def test_hostile_data_files_exit_2_with_one_sentence_before_any_model_loads(tmp_path, name, text, says):
    _png(tmp_path / "a.png")
    (tmp_path / "bad.png").write_bytes(b"not a png at all")
    (tmp_path / name).write_text(text)
    # No engine is reachable on port 9: the data must be refused before one is asked.
    result = run_cli("eval", "screenspot", str(tmp_path / name), "--engine", "openai:http://127.0.0.1:9", timeout=60)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_hit_is_judged_on_the_unrounded_point_in_img_size_coordinates(tmp_path):
    """The public evaluations compare fractions of the image: a point just right of the box misses even
    when it falls on the box's last whole pixel, and a box stated for a larger img_size is scaled."""
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.eval.screenspot import evaluate

    _png(tmp_path / "images" / "s.png", size=(1000, 500))
    rows = [
        # 1000 px wide: grid x 100.5 is pixel 100.5, past the box's right edge at 100 (whole pixel 100 is in).
        {"img_filename": "s.png", "bbox": [50, 50, 50, 50], "instruction": "edge", "data_type": "t"},
        {"img_filename": "s.png", "bbox": [50, 50, 50, 50], "instruction": "inside", "data_type": "t"},
    ]
    (tmp_path / "v2.json").write_text(json.dumps(rows))
    pro = [  # stated for a 2000x1000 original: the box is x 200-400 of 2000, i.e. 100-200 of the 1000 on disk
        {
            "img_filename": "s.png",
            "bbox": [200, 200, 400, 400],
            "img_size": [2000, 1000],
            "instruction": "scaled",
            "ui_type": "icon",
            "group": "g",
            "platform": "p",
        },
    ]
    (tmp_path / "pro.json").write_text(json.dumps(pro))
    call = (
        '<tool_call>\n{{"name": "computer_use", "arguments": {{"action": "left_click", "coordinate": [{}, {}]}}}}'
        "\n</tool_call>"
    )
    engine = ReplayEngine([call.format(100.5, 150), call.format(100, 150), call.format(150, 300)])
    items = load_dataset(tmp_path / "v2.json") + load_dataset(tmp_path / "pro.json")
    outcomes = evaluate(engine, items, tmp_path / "out", progress=None)
    assert [o.hit for o in outcomes] == [False, True, True]
    assert items[2].box == (100.0, 100.0, 200.0, 200.0)


def test_the_platform_split_is_the_items_own_then_a_word_of_the_file_name_then_its_source(tmp_path):
    _png(tmp_path / "a.png")

    def item(**extra):
        return {"img_filename": "a.png", "bbox": [1, 2, 3, 4], "instruction": "x", "data_type": "text", **extra}

    (tmp_path / "screenspot_web_v2.json").write_text(json.dumps([item(data_source="gitlab"), item(platform="ios")]))
    (tmp_path / "mywebdata.json").write_text(json.dumps([item(data_source="shop")]))
    platforms = [i.splits["platform"] for i in load_dataset(tmp_path)]
    assert platforms == ["shop", "web", "ios"]  # files in name order: mywebdata, screenspot_web_v2


def test_a_grounding_reply_is_read_by_its_coordinate_whatever_the_action_is_called():
    """The ScreenSpot-Pro adapter for Qwen3-VL takes the tool call's `coordinate` as the answer without
    looking at the action's name; so does `locate`, or such replies would score lower here than there."""
    from qvl_agent.errors import ParseError
    from qvl_agent.grounding import point_in_reply

    def tool(name: str, arguments: dict) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    assert point_in_reply(tool("computer_use", {"action": "click", "coordinate": [120, 340]})) == (120, 340)
    assert point_in_reply(tool("click", {"coordinate": [12.5, 34]})) == (12.5, 34)
    assert point_in_reply(tool("computer_use", {"action": "type", "text": "a", "coordinate": [7, 8]})) == (7, 8)
    drag = {"action": "drag", "start_coordinate": [1, 2], "coordinate": [30, 40]}
    assert point_in_reply(tool("computer_use", drag)) == (30, 40)
    with pytest.raises(ParseError):
        point_in_reply(tool("computer_use", {"action": "type", "text": "no point here"}))


def test_a_second_evaluation_into_the_same_folder_leaves_no_pictures_of_the_first(tmp_path):
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.eval.screenspot import evaluate, summarize, write_screenspot_report

    _png(tmp_path / "a.png")
    rows = [
        {"img_filename": "a.png", "bbox": [0, 0, 10, 10], "instruction": f"x{i}", "data_type": "t"} for i in range(3)
    ]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    items = load_dataset(tmp_path / "d.json")
    out = tmp_path / "out"
    far, near = '{"point_2d": [900, 900]}', '{"point_2d": [10, 10]}'
    for replies in ([far, far, far], [near, near, far]):
        outcomes = evaluate(ReplayEngine(replies), items, out, progress=None)
        write_screenspot_report(out, outcomes, summarize(outcomes))
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["hit-1.png", "hit-2.png", "miss-1.png"]


def test_locate_on_a_turned_photo_answers_in_pixels_as_it_is_shown_and_a_huge_image_in_one_sentence(tmp_path):
    """A phone photo stored 400x200 with EXIF orientation 6 is shown (and seen by the model) 200x400; an
    image over the pixel limit is refused in one sentence, without Pillow's warning before it."""
    photo = tmp_path / "photo.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show
    Image.new("RGB", (400, 200), (200, 30, 30)).save(photo, exif=exif.tobytes())
    replies = tmp_path / "r.json"
    call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 250]}}
    replies.write_text(json.dumps(["<tool_call>\n" + json.dumps(call) + "\n</tool_call>"]))
    done = run_cli("locate", "--image", str(photo), "--engine", f"replay:{replies}", "the red thing")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["100", "100"]  # half across 200, a quarter down 400
    huge = tmp_path / "huge.png"
    Image.new("1", (12000, 8000)).save(huge)  # 96 million pixels, over Pillow's own warning limit too
    refused = run_cli("locate", "--image", str(huge), "--engine", f"replay:{replies}", "x")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"qvl-agent: {huge} is 12000x8000 = 96,000,000 pixels, over the limit of 64,000,000 pixels; "
        "resize it or capture a region."
    ]
    # ScreenSpot data on such a photo: the box is in the pixels as shown, and the hit is judged there.
    rows = [{"img_filename": "photo.jpg", "bbox": [90, 90, 20, 20], "instruction": "red", "data_type": "icon"}]
    (tmp_path / "set.json").write_text(json.dumps(rows))
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.eval.screenspot import evaluate

    engine = ReplayEngine(["<tool_call>\n" + json.dumps(call) + "\n</tool_call>"])
    outcomes = evaluate(engine, load_dataset(tmp_path / "set.json"), tmp_path / "out", progress=None)
    assert [o.hit for o in outcomes] == [True] and outcomes[0].point == (100, 100)
