"""ScreenSpot-family grounding accuracy: one `locate` per item, a hit when the point is inside the box.

A data set is a JSON file (a list of items), a JSONL file (one item per line) or a folder holding such
files (searched recursively, e.g. ScreenSpot-Pro's `annotations/`). Each file's layout is detected
from its fields:

    ScreenSpot / ScreenSpot-v2   img_filename, bbox = [x, y, w, h], instruction, data_type,
                                 data_source (or platform)
    ScreenSpot-Pro               img_filename, bbox = [x1, y1, x2, y2], img_size, instruction,
                                 ui_type, group, platform

An image is looked for relative to its file, in an `images/` folder beside the file or beside the
file's folder, then in the other folders beside the file (the v1/v2 downloads use `screenspot_imgs/`
and `screenspotv2_image/`). Splits: platform (the item's platform; else the word mobile/desktop/web in a
ScreenSpot file's name; else its data_source), type (text/icon: data_type or ui_type) and, for ScreenSpot-Pro, group.

A hit is decided the way the public evaluations decide it: the model's 0-1000 point, as a fraction of
the image, inside the box as a fraction of the image (ScreenSpot-Pro's `img_size`, so a set whose
screenshots were resized still scores right), edges included, with no rounding to whole pixels.
"""

from __future__ import annotations

import html
import json
import math
import random
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from qvl_agent.actions import printable
from qvl_agent.engine.base import Engine
from qvl_agent.errors import ParseError, UsageError
from qvl_agent.eval.report import ResultsWriter, latency_line, rate, table, write_report
from qvl_agent.grounding import GroundedPoint, Zoom, ask, grounded, profile_of, wants_zoom, zoom_in
from qvl_agent.image import GRID, load_image

LAYOUT_V2 = "ScreenSpot/v2"
LAYOUT_PRO = "ScreenSpot-Pro"
SAMPLES = 6  # hits and misses each, drawn in the report


@dataclass(frozen=True)
class Item:
    id: str
    image: Path
    instruction: str
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in image pixels
    layout: str
    splits: dict[str, str] = field(default_factory=dict)

    def contains(self, x: float, y: float) -> bool:
        """Whether the point (image pixels, fractions allowed) is inside the box, edges included."""
        x1, y1, x2, y2 = self.box
        return x1 <= x <= x2 and y1 <= y <= y2


# --- reading a data set -------------------------------------------------------------------------------


def _read_items(path: Path, strict: bool = True) -> list[dict]:
    """The items of one data file. In a folder (`strict` False) a JSON file that holds no items with
    `img_filename` (a download's metadata, say) is skipped instead of refused."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read the data file {path}: {exc}.") from None
    if path.suffix == ".jsonl":
        data = [_parse_json(line, path, n) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        data = _parse_json(text, path)
    is_data = isinstance(data, list) and all(isinstance(d, dict) for d in data)
    if not strict and not (is_data and any("img_filename" in d for d in data)):
        return []
    if not is_data:
        raise UsageError(f"The data file {path} must hold a list of items (JSON objects).")
    return data


def _parse_json(text: str, path: Path, line: int | None = None):
    """One JSON document; anything the parser chokes on (syntax, absurd nesting, a number too long to
    convert) is one sentence naming the file and, for JSONL, the line."""
    where = f"{path}" if line is None else f"{path} line {line}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"The data file {where} is not valid JSON ({exc}).") from None
    except RecursionError:
        raise UsageError(f"The data file {where} is nested too deeply to be data.") from None
    except ValueError as exc:  # e.g. an integer with thousands of digits
        raise UsageError(f"The data file {where} is not usable JSON ({exc}).") from None


def detect_layout(items: list[dict], path: Path) -> str:
    """ScreenSpot-Pro when items carry img_size, ui_type or group; ScreenSpot/v2 when they carry
    data_type or data_source; anything else is refused with a sentence naming the file."""
    keys = set().union(*(d.keys() for d in items)) if items else set()
    if keys & {"img_size", "ui_type", "group"}:
        return LAYOUT_PRO
    if keys & {"data_type", "data_source"}:
        return LAYOUT_V2
    raise UsageError(
        f"{path} is neither ScreenSpot/v2 (data_type, bbox [x, y, w, h]) nor ScreenSpot-Pro "
        "(img_size, ui_type, bbox [x1, y1, x2, y2]) data."
    )


def _image_folders(path: Path) -> list[Path]:
    here = path.parent
    folders = [here, here / "images", here.parent / "images"]
    folders += sorted(p for p in here.iterdir() if p.is_dir() and p not in folders)
    return folders


def _find_image(name: str, folders: list[Path]) -> Path | None:
    for folder in folders:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def _platform(raw: dict, path: Path, layout: str) -> str:
    """The item's own `platform` first; else, for ScreenSpot/v2, the split its file name names as a word
    (screenspot_mobile_v2.json: mobile, but not mywebdata.json); else its data_source."""
    if raw.get("platform"):
        return str(raw["platform"])
    if layout == LAYOUT_V2:
        words = re.split(r"[^a-z]+", path.stem.lower())
        for split in ("mobile", "desktop", "web"):
            if split in words:
                return split
    return str(raw.get("data_source") or "unknown")


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _box(raw: dict, layout: str, where: str, size: tuple[int, int]) -> tuple[float, float, float, float]:
    """The item's box as x1, y1, x2, y2 in pixels of the image on disk."""
    bbox = raw.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
        raise UsageError(f"{where}: bbox must be four numbers, not {str(bbox)[:80]}.")
    a, b, c, d = (float(v) for v in bbox)
    x1, y1, x2, y2 = (a, b, a + c, b + d) if layout == LAYOUT_V2 else (a, b, c, d)
    if x2 < x1 or y2 < y1:
        raise UsageError(f"{where}: bbox {bbox} has a negative width or height.")
    stated = raw.get("img_size")
    if layout == LAYOUT_PRO and stated is not None:
        if not (isinstance(stated, list) and len(stated) == 2 and all(_is_number(v) and v > 0 for v in stated)):
            raise UsageError(f"{where}: img_size must be [width, height], not {str(stated)[:80]}.")
        sx, sy = size[0] / stated[0], size[1] / stated[1]  # the box is in img_size pixels
        x1, y1, x2, y2 = x1 * sx, y1 * sy, x2 * sx, y2 * sy
    return x1, y1, x2, y2


def _image_size(image: Path) -> tuple[int, int]:
    """The image's size from its header alone, as shown (a photo's EXIF orientation turned, as `load_image`
    turns it): an unreadable image is refused before a model loads."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(image) as im:
            turned = im.getexif().get(0x0112) in (5, 6, 7, 8)  # orientations a quarter turn away
            return im.size[::-1] if turned else im.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise UsageError(f"{image} is not an image that can be read (PNG, JPEG, WebP, BMP or GIF).") from None


def load_dataset(data: str | Path) -> list[Item]:
    """Every item of the data set at `data` (a file or a folder), with its image found on disk."""
    root = Path(data)
    if root.is_dir():
        files = sorted(
            p
            for p in root.rglob("*")
            if p.suffix in (".json", ".jsonl")
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
        if not files:
            raise UsageError(f"The folder {root} holds no .json or .jsonl data files.")
    elif root.is_file():
        files = [root]
    else:
        raise UsageError(f"No such data file or folder: {root}.")
    items: list[Item] = []
    for path in files:
        raw_items = _read_items(path, strict=len(files) == 1)
        if not raw_items:
            continue
        layout = detect_layout(raw_items, path)
        folders = _image_folders(path)
        for i, raw in enumerate(raw_items):
            where = f"{path} item {i + 1}"
            name, instruction = raw.get("img_filename"), raw.get("instruction")
            if not isinstance(name, str) or not isinstance(instruction, str) or not instruction.strip():
                raise UsageError(f"{where} needs img_filename and instruction.")
            image = _find_image(name, folders)
            if image is None:
                raise UsageError(f"{where}: the image {name} is neither beside {path.name} nor in an images/ folder.")
            splits = {"platform": _platform(raw, path, layout)}
            kind = raw.get("data_type") or raw.get("ui_type")
            if kind:
                splits["type"] = str(kind)
            if raw.get("group"):
                splits["group"] = str(raw["group"])
            item_id = str(raw["id"]) if raw.get("id") not in (None, "") else f"{path.stem}:{i + 1}"
            box = _box(raw, layout, where, _image_size(image))
            items.append(Item(item_id, image, instruction.strip(), box, layout, splits))
    if not items:
        raise UsageError(f"The data set {root} has no items.")
    return items


# --- running it ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    item: Item
    point: tuple[int, int] | None
    model_point: tuple[float, float] | None
    hit: bool
    ms: float
    reply: str
    error: str = ""
    # With --zoom: the first (whole-screen) pass on its own, so one run gives both figures side by side.
    single_hit: bool | None = None
    single_ms: float | None = None


def _hit(item: Item, found: GroundedPoint, shot) -> bool:
    # The hit is judged on the unrounded point, as the public evaluations judge it.
    return item.contains(found.model_x * shot.width / GRID, found.model_y * shot.height / GRID)


def _zoomed(engine, item: Item, shot, first: GroundedPoint, zoom: Zoom) -> Outcome:
    single = _hit(item, first, shot)
    if not wants_zoom(engine, shot, item.instruction, first, zoom, profile_of(engine)):
        return Outcome(item, (first.x, first.y), (first.model_x, first.model_y), single, first.ms, first.reply,
                       single_hit=single, single_ms=first.ms)  # fmt: skip
    found = zoom_in(engine, shot, item.instruction, first, zoom)
    return Outcome(item, (found.x, found.y), (found.model_x, found.model_y), _hit(item, found, shot), found.ms,
                   found.reply, single_hit=single, single_ms=first.ms)  # fmt: skip


def evaluate(
    engine: Engine, items: list[Item], out: Path, progress=sys.stderr, zoom: Zoom | None = None
) -> list[Outcome]:
    """Ask for every item in order; each outcome goes to `out/results.jsonl` as soon as it is known.
    With `zoom`, each item also records the first pass's own hit and time (`single_hit`, `single_ms`)."""
    writer = ResultsWriter(out)
    outcomes: list[Outcome] = []
    try:
        for n, item in enumerate(items, 1):
            shot = load_image(item.image)
            reply, ms = ask(engine, shot, item.instruction)
            try:
                found = grounded(reply, ms, shot, profile_of(engine))
                if zoom is not None:
                    outcome = _zoomed(engine, item, shot, found, zoom)
                else:
                    point, model_point = (found.x, found.y), (found.model_x, found.model_y)
                    outcome = Outcome(item, point, model_point, _hit(item, found, shot), ms, reply)
            except ParseError as exc:  # a reply without a point is a miss, not the end of the run
                single = (False, ms) if zoom is not None else (None, None)
                outcome = Outcome(item, None, None, False, ms, reply, str(exc), *single)
            outcomes.append(outcome)
            writer.write(
                {
                    "id": item.id,
                    "point": list(outcome.point) if outcome.point else None,
                    "hit": outcome.hit,
                    "ms": round(outcome.ms, 1),
                    "model_point": list(outcome.model_point) if outcome.model_point else None,
                    "box": list(item.box),
                    "instruction": item.instruction,
                    "image": str(item.image),
                    **item.splits,
                    **({"error": outcome.error} if outcome.error else {}),
                    **(
                        {"single_hit": outcome.single_hit, "single_ms": round(outcome.single_ms, 1)}
                        if outcome.single_hit is not None
                        else {}
                    ),
                }
            )
            if progress is not None and (n % 25 == 0 or n == len(items)):
                hits = sum(o.hit for o in outcomes)
                print(f"screenspot: {n}/{len(items)} done, {rate(hits, n)} so far", file=progress, flush=True)
    finally:
        writer.close()
    return outcomes


def summarize(outcomes: list[Outcome]) -> list[str]:
    """The lines printed and put at the top of the report: overall, per split, latency. A zoomed run
    shows each figure with zoom and without it (its first pass) side by side."""
    layouts = sorted({o.item.layout for o in outcomes})
    zoomed = bool(outcomes) and all(o.single_hit is not None for o in outcomes)

    def figure(group: list[Outcome]) -> str:
        with_zoom = rate(sum(o.hit for o in group), len(group))
        return f"{with_zoom} with zoom, {rate(sum(bool(o.single_hit) for o in group), len(group))} without" if (
            zoomed) else with_zoom  # fmt: skip

    lines = [f"ScreenSpot ({', '.join(layouts)}): accuracy {figure(outcomes)}"]
    by: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        for dim, value in o.item.splits.items():
            by[(dim, value)].append(o)
        if "type" in o.item.splits:
            by[("platform/type", f"{o.item.splits['platform']}/{o.item.splits['type']}")].append(o)
    for (dim, value), group in sorted(by.items()):
        # Split names come from the data file: escaped like model text, for the terminal and the report alike.
        lines.append(f"  {dim}={printable(value)}: {figure(group)}")
    if zoomed:
        lines.append(latency_line([o.ms for o in outcomes], "per click with zoom"))
        lines.append(latency_line([o.single_ms for o in outcomes], "per click without zoom"))
    else:
        lines.append(latency_line([o.ms for o in outcomes]))
    unanswered = sum(o.point is None for o in outcomes)
    if unanswered:
        replies = "reply" if unanswered == 1 else "replies"
        lines.append(f"{unanswered} {replies} named no point (counted as misses)")
    return lines


def _draw(outcome: Outcome, path: Path) -> None:
    from PIL import Image, ImageDraw, ImageOps

    with Image.open(outcome.item.image) as img:
        img = ImageOps.exif_transpose(img).convert("RGB")
        draw = ImageDraw.Draw(img)
        width = max(2, img.width // 400)
        draw.rectangle(outcome.item.box, outline=(0, 170, 0), width=width)
        if outcome.point:
            x, y = outcome.point
            r = max(6, img.width // 120)
            draw.ellipse((x - r, y - r, x + r, y + r), outline=(220, 0, 0), width=width)
            draw.line((x - 2 * r, y, x + 2 * r, y), fill=(220, 0, 0), width=width)
            draw.line((x, y - 2 * r, x, y + 2 * r), fill=(220, 0, 0), width=width)
        img.thumbnail((800, 800))
        img.save(path)


def write_screenspot_report(
    out: Path, outcomes: list[Outcome], lines: list[str], seed: int = 0, facts: list[tuple[str, str]] = ()
) -> Path:
    """`report.html`: the figures, a table per item, and a sample of misses and hits drawn on their
    screenshots (green box: the truth; red cross: the model's point). Misses come first, in the pictures
    and in the table: they are what a person reads a report for."""
    rng = random.Random(seed)
    hits = [o for o in outcomes if o.hit]
    misses = [o for o in outcomes if not o.hit]
    samples = out / "samples"
    samples.mkdir(exist_ok=True)
    for old in [*samples.glob("hit-*.png"), *samples.glob("miss-*.png")]:  # an earlier run into the same --out
        old.unlink()
    figures = []
    for kind, group in (("miss", misses), ("hit", hits)):
        for i, o in enumerate(rng.sample(group, min(SAMPLES, len(group)))):
            name = f"{kind}-{i + 1}.png"
            _draw(o, samples / name)
            caption = f"{kind}: {o.item.instruction} ({o.item.id})"
            figures.append(
                f"<figure><img src='samples/{name}'><figcaption class='{kind}'>{html.escape(caption)}"
                "</figcaption></figure>"
            )
    listed = misses + hits
    rows = [(o.item.id, o.item.instruction, "yes" if o.hit else "no", o.point or "-", f"{o.ms:.0f}") for o in listed]
    sections = [
        ("Misses and hits (green: the element's box, red: the model's point)", "".join(figures) or "none"),
        ("Items", table(("id", "instruction", "hit", "point", "ms"), rows)),
    ]
    return write_report(out, "qvl-agent eval screenspot", lines, sections, facts)
