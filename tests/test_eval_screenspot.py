"""`qvl-agent locate` and `qvl-agent eval screenspot` on a ScreenSpot-format set the tests render
themselves: HTML pages served on 127.0.0.1, screenshotted in real Chromium, element boxes measured by
the browser. A test-only OpenAI-compatible oracle server reads the truth and answers through
`--engine openai:URL`: all right (100 %), or every third item wrong on purpose (the exact lower figure).
"""

from __future__ import annotations

import http.server
import json
import random
import threading
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.pages.helpers import MEASURING
from tests.support.screenspot_oracle import GroundingOracle, serve

pytestmark = [pytest.mark.browser]

WORDS = ["Save", "Open", "Print", "Share", "Delete", "Search", "Settings", "Help", "Undo", "Export"]
PAGES = [  # (name, viewport, platform, how many elements)
    ("desk", (1280, 800), "windows", 4),
    ("phone", (400, 860), "android", 3),
    ("wide", (1600, 900), "macos", 3),
]


def _page_html(rng: random.Random, count: int, viewport: tuple[int, int]) -> tuple[str, list[dict]]:
    elements, spans = [], []
    for i in range(count):
        w, h = rng.randint(40, 180), rng.randint(24, 60)
        x = rng.randint(0, viewport[0] - w)
        y = rng.randint(0, viewport[1] - h)
        label = WORDS[(i * 3 + count) % len(WORDS)]
        kind = "icon" if i % 2 else "text"
        content = "&#9881;" if kind == "icon" else label
        spans.append(
            f'<button id="e{i}" style="position:absolute;left:{x}px;top:{y}px;width:{w}px;height:{h}px">'
            f"{content}</button>"
        )
        elements.append({"id": f"e{i}", "instruction": f"{label} button number {i}", "kind": kind})
    return "<!doctype html><body style='margin:0;background:#eef'>" + "".join(spans) + "</body>", elements


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Both public layouts of the same 10 items: v2 (file + screenspotv2_image/) and Pro (annotations/ +
    images/<app>/)."""
    root = tmp_path_factory.mktemp("screenspot")
    site = root / "site"
    site.mkdir()
    rng = random.Random(7)
    specs = []
    for name, viewport, platform, count in PAGES:
        page_html, elements = _page_html(rng, count, viewport)
        (site / f"{name}.html").write_text(page_html)
        specs.append((name, viewport, platform, elements))
    v2_dir, pro_dir = root / "v2", root / "pro"
    (v2_dir / "screenspotv2_image").mkdir(parents=True)
    (pro_dir / "annotations").mkdir(parents=True)
    v2_items, pro_items = [], []
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def render(browser) -> list[tuple[bytes, list[dict]]]:
        """Each page's screenshot and its elements' boxes, each page in a context of its own."""
        shots = []
        for name, viewport, _platform, elements in specs:
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            try:
                page = context.new_page()
                page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/{name}.html")
                shots.append((page.screenshot(), [page.locator(f"#{el['id']}").bounding_box() for el in elements]))
            finally:
                context.close()
        return shots

    try:
        # In the Chromium the browser tests measure pages in (tests/pages/helpers.py), kept for the session.
        shots = MEASURING.run(render)
    finally:
        httpd.shutdown()
    for (name, viewport, platform, elements), (png, boxes) in zip(specs, shots, strict=True):
        (v2_dir / "screenspotv2_image" / f"{name}.png").write_bytes(png)
        (pro_dir / "images" / f"app_{platform}").mkdir(parents=True, exist_ok=True)
        (pro_dir / "images" / f"app_{platform}" / f"{name}.png").write_bytes(png)
        for el, b in zip(elements, boxes, strict=True):
            v2_items.append(
                {
                    "img_filename": f"{name}.png",
                    "bbox": [b["x"], b["y"], b["width"], b["height"]],
                    "instruction": el["instruction"],
                    "data_type": el["kind"],
                    "data_source": platform,
                }
            )
            pro_items.append(
                {
                    "img_filename": f"app_{platform}/{name}.png",
                    "bbox": [b["x"], b["y"], b["x"] + b["width"], b["y"] + b["height"]],
                    "img_size": list(viewport),
                    "instruction": el["instruction"],
                    "ui_type": el["kind"],
                    "group": "Dev" if platform == "windows" else "Office",
                    "platform": platform,
                    "id": f"pro-{name}-{el['id']}",
                }
            )
    (v2_dir / "screenspot_web_v2.json").write_text(json.dumps(v2_items))
    (pro_dir / "annotations" / "apps.json").write_text(json.dumps(pro_items))
    return {"v2": v2_dir / "screenspot_web_v2.json", "pro": pro_dir, "v2_items": v2_items, "pro_items": pro_items}


@pytest.fixture
def oracle(dataset, request):
    """`(url, oracle)` for the data set named by the test's parameter, right or every third wrong."""
    layout, wrong_every = request.param
    truth = GroundingOracle(dataset[layout], wrong_every)
    httpd = serve(truth)
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", truth
    httpd.shutdown()


def _results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("oracle", [("v2", 0)], indirect=True)
def test_an_oracle_that_knows_the_truth_scores_100_percent_on_the_v2_layout(dataset, oracle, tmp_path):
    url, truth = oracle
    out = tmp_path / "out"
    done = run_cli("eval", "screenspot", str(dataset["v2"]), "--out", str(out), "--engine", f"openai:{url}")
    assert done.returncode == 0, done.stderr
    assert "accuracy 100.00% (10/10)" in done.stdout
    assert "platform=web: 100.00% (10/10)" in done.stdout  # ScreenSpot's file name says the split
    assert "type=icon: 100.00% (4/10)" not in done.stdout and "type=icon: 100.00% (4/4)" in done.stdout
    assert "median" in done.stdout and "p90" in done.stdout
    rows = _results(out)
    assert len(rows) == 10 and all(r["hit"] for r in rows) and truth.requests == 10
    for row, item in zip(rows, dataset["v2_items"], strict=True):
        x, y, w, h = item["bbox"]
        assert x <= row["point"][0] <= x + w and y <= row["point"][1] <= y + h
        assert set(row) >= {"id", "point", "hit", "ms"}
    report = (out / "report.html").read_text()
    assert "100.00% (10/10)" in report and "samples/hit-1.png" in report
    assert (out / "samples" / "hit-1.png").stat().st_size > 1000


@pytest.mark.parametrize("oracle", [("pro", 3)], indirect=True)
def test_an_oracle_wrong_on_every_third_item_scores_exactly_that_much_less_on_the_pro_layout(dataset, oracle, tmp_path):
    url, _ = oracle
    out = tmp_path / "out"
    done = run_cli("eval", "screenspot", str(dataset["pro"]), "--out", str(out), "--engine", f"openai:{url}")
    assert done.returncode == 0, done.stderr
    # Items 3, 6 and 9 of 10 are answered outside their boxes.
    assert "ScreenSpot (ScreenSpot-Pro): accuracy 70.00% (7/10)" in done.stdout
    rows = _results(out)
    assert [r["hit"] for r in rows] == [n % 3 != 0 for n in range(1, 11)]
    assert rows[0]["id"] == "pro-desk-e0"
    # Per split figures follow from which items were wrong: desk has items 1-4 (3 wrong), phone 5-7 (6).
    assert "platform=windows: 75.00% (3/4)" in done.stdout
    assert "platform=android: 66.67% (2/3)" in done.stdout
    assert "group=Dev: 75.00% (3/4)" in done.stdout
    assert "samples/miss-1.png" in (out / "report.html").read_text()


@pytest.mark.parametrize("oracle", [("v2", 0)], indirect=True)
def test_limit_and_bad_data(dataset, oracle, tmp_path):
    url, _ = oracle
    done = run_cli(
        "eval",
        "screenspot",
        str(dataset["v2"]),
        "--limit",
        "4",
        "--out",
        str(tmp_path / "a"),
        "--engine",
        f"openai:{url}",
    )
    assert done.returncode == 0 and "(4/4)" in done.stdout and len(_results(tmp_path / "a")) == 4
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps([{"img_filename": "nope.png", "bbox": [1, 2, 3, 4], "instruction": "x", "data_type": "text"}])
    )
    for data in (broken, tmp_path / "missing.json"):
        bad = run_cli("eval", "screenspot", str(data), "--out", str(tmp_path / "b"), "--engine", f"openai:{url}")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    unknown = tmp_path / "other.json"
    unknown.write_text(json.dumps([{"img_filename": "a.png", "bbox": [1, 2, 3, 4], "instruction": "x"}]))
    bad = run_cli("eval", "screenspot", str(unknown), "--engine", f"openai:{url}")
    assert bad.returncode == 2 and "neither ScreenSpot/v2" in bad.stderr


@pytest.mark.parametrize("oracle", [("v2", 0)], indirect=True)
def test_locate_prints_the_point_and_json_and_exits_1_without_one(dataset, oracle):
    url, _ = oracle
    item = dataset["v2_items"][1]
    image = str(dataset["v2"].parent / "screenspotv2_image" / item["img_filename"])
    done = run_cli("locate", "--image", image, "--engine", f"openai:{url}", item["instruction"])
    assert done.returncode == 0, done.stderr
    x, y = (int(v) for v in done.stdout.split())
    bx, by, bw, bh = item["bbox"]
    assert bx <= x <= bx + bw and by <= y <= by + bh
    js = run_cli("locate", "--image", image, "--json", "--engine", f"openai:{url}", item["instruction"])
    answer = json.loads(js.stdout)
    assert set(answer) == {"x", "y", "model_x", "model_y", "ms"} and (answer["x"], answer["y"]) == (x, y)
    assert 0 <= answer["model_x"] <= 1000 and answer["ms"] >= 0
    none = run_cli("locate", "--image", image, "--engine", f"openai:{url}", "the purple elephant")
    assert none.returncode == 1 and none.stdout == ""
    assert len(none.stderr.strip().splitlines()) == 1 and "names no point" in none.stderr
    usage = run_cli("locate", "--image", image, "--monitor", "1", "--engine", f"openai:{url}", "x")
    assert usage.returncode == 2
