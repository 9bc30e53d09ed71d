"""What the eval reports say beside the figures (model, engine, date, version), that the MiniWoB++ table
holds the very figures printed on the terminal, and that data-set text reaches the terminal escaped."""

from __future__ import annotations

import html
import json
import re

import pytest
from PIL import Image

from qvl_agent import __version__
from qvl_agent.config import Settings
from qvl_agent.eval import miniwob as mw
from qvl_agent.eval.report import run_facts
from tests.conftest import run_cli
from tests.pages.helpers import call

HOSTILE = "web\x1b]0;OWNED\x07\x1b[2J"  # sets the terminal's title, then clears the screen


def _facts(page: str) -> dict[str, str]:
    block = re.search(r"<table class='facts'>(.*?)</table>", page, re.S)
    assert block, "the report names no model/engine/date/version"
    return {
        html.unescape(k): html.unescape(v) for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", block[1])
    }


@pytest.fixture(scope="module")
def screenspot_run(tmp_path_factory):
    """`eval screenspot` on a one-item data set whose split name carries terminal escapes."""
    root = tmp_path_factory.mktemp("screenspot")
    Image.new("RGB", (100, 80), (200, 200, 200)).save(root / "shot.png")
    item = {"img_filename": "shot.png", "bbox": [40, 30, 20, 20], "instruction": "the grey \x1b[5m box",
            "data_type": "text", "data_source": HOSTILE}  # fmt: skip
    (root / "data.json").write_text(json.dumps([item]), encoding="utf-8")
    replies = root / "replies.json"
    replies.write_text(json.dumps([call(action="left_click", coordinate=[500, 500])]), encoding="utf-8")
    out = root / "out"
    done = run_cli("eval", "screenspot", str(root / "data.json"), "--out", str(out), "--engine", f"replay:{replies}")
    assert done.returncode == 0, done.stderr
    return done, out, replies


def test_dataset_text_reaches_the_terminal_escaped(screenspot_run):
    done, _, _ = screenspot_run
    assert "accuracy 100.00% (1/1)" in done.stdout
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    assert "platform=web\\x1b]0;OWNED\\x07\\x1b[2J: 100.00% (1/1)" in done.stdout


def test_a_bad_item_is_refused_with_its_text_escaped(tmp_path):
    (tmp_path / "data.json").write_text(
        json.dumps([{"img_filename": "\x1b[2Jgone.png", "bbox": [0, 0, 1, 1], "instruction": "x", "data_type": "text"}])
    )
    done = run_cli("eval", "screenspot", str(tmp_path / "data.json"), "--engine", "replay:/nonexistent.json")
    assert done.returncode == 2
    assert "\x1b" not in done.stderr and "the image \\x1b[2Jgone.png is neither" in done.stderr


def test_the_screenspot_report_names_model_engine_date_and_version(screenspot_run):
    _, out, replies = screenspot_run
    facts = _facts((out / "report.html").read_text(encoding="utf-8"))
    assert facts["model"] == "none (recorded replies)"
    assert facts["engine"] == f"replay file {replies} (recorded replies, no model)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", facts["date"])
    assert facts["qvl-agent"] == __version__


def test_facts_for_a_local_and_a_remote_engine():
    local = dict(run_facts(Settings(model="someone/model", device="cpu"), None))
    assert local["model"] == "someone/model" and local["engine"] == "local model someone/model on device cpu"

    class Remote:  # what RemoteEngine exposes: the model it asked its server for
        model = "served-model"

    remote = dict(run_facts(Settings(engine="openai:http://127.0.0.1:9/v1", api_key="k"), Remote()))
    assert remote["model"] == "served-model"
    assert remote["engine"].startswith("remote OpenAI-compatible server http://127.0.0.1:9/v1")


def _episode(task: str, n: int, success: bool, steps: int, ms: float) -> mw.Episode:
    return mw.Episode(task, n, n, "Click it", success, 1.0 if success else 0.0, steps, ms, "success")


def test_the_miniwob_table_says_what_the_terminal_says(tmp_path):
    episodes = [
        _episode("click-button", 1, True, 2, 1000.0),
        _episode("click-button", 2, True, 3, 1500.0),
        _episode("click-button", 3, False, 4, 1234.0),
        _episode("enter-text", 1, False, 5, 987.6),
    ]
    lines, rows = mw.summarize(episodes)
    page = mw.write_miniwob_report(tmp_path, episodes, lines, rows).read_text(encoding="utf-8")
    tasks = page.split("<h2>Tasks</h2>")[1].split("</table>")[0]
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", tasks) if "<td>" in row]
    assert [c[0] for c in cells] == ["click-button", "enter-text"]
    for task, count, success, steps, ms in cells:
        printed = next(line for line in lines if line.startswith(f"  {task}: "))
        assert printed == f"  {task}: {success}, {steps} steps, {ms} ms per step"
        assert success.endswith(f"/{count})")
    assert cells[0][2] == "66.67% (2/3)"


def test_reports_list_misses_before_hits(tmp_path):
    """A person opens a report to see what went wrong: misses (and failed episodes) come first."""
    Image.new("RGB", (100, 80), (200, 200, 200)).save(tmp_path / "shot.png")
    items = [
        {"img_filename": "shot.png", "bbox": [40, 30, 20, 20], "instruction": f"box {n}", "data_type": "text"}
        for n in (1, 2, 3)
    ]
    (tmp_path / "data.json").write_text(json.dumps(items), encoding="utf-8")
    replies = tmp_path / "replies.json"
    points = ([500, 500], [50, 50], [500, 500])  # the second misses the box
    replies.write_text(json.dumps([call(action="left_click", coordinate=p) for p in points]), encoding="utf-8")
    out = tmp_path / "out"
    data = str(tmp_path / "data.json")
    done = run_cli("eval", "screenspot", data, "--out", str(out), "--engine", f"replay:{replies}")
    assert done.returncode == 0, done.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    captions = re.findall(r"<figcaption class='(\w+)'>", page)
    assert captions == ["miss", "hit", "hit"]
    items_table = page.split("<h2>Items</h2>")[1].split("</table>")[0]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", items_table) if "<td>" in row]
    assert [(r[1], r[2]) for r in rows] == [("box 2", "no"), ("box 1", "yes"), ("box 3", "yes")]

    episodes = [_episode("click-button", 1, True, 2, 1000.0), _episode("click-button", 2, False, 4, 1234.0)]
    lines, task_rows = mw.summarize(episodes)
    page = mw.write_miniwob_report(tmp_path, episodes, lines, task_rows).read_text(encoding="utf-8")
    listed = page.split("<h2>Episodes</h2>")[1].split("</table>")[0]
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", listed) if "<td>" in row]
    assert [(c[1], c[4]) for c in cells] == [("2", "no"), ("1", "yes")]
