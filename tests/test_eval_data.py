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
