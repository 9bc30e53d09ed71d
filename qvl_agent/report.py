"""A run's visual report: one self-contained `report.html` in the run folder, for people to look at.

Per step: the screenshot (embedded, scaled to at most 1280 px wide; it links to the raw step PNG beside
the report) with every click, drag and scroll drawn over it in SVG, the model's reply, the parsed
actions, the guard's verdict, the results, the timings (capture / model / act) and an error fed back to
the model; above the steps a summary of the run and a timeline strip of thumbnails. Failed steps and a
run that did not succeed are drawn in red.

The step PNGs stay the raw screen: markers exist only in the HTML. Everything that comes from the model
or the page is escaped, and the page carries a Content-Security-Policy that allows no script at all, so
a hostile reply cannot run code in the viewer's browser. This module imports no GUI or ML library.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
from importlib import resources
from pathlib import Path
from string import Template

from PIL import Image

from qvl_agent.errors import InputError
from qvl_agent.trace import PLAYWRIGHT_TRACE, Trace, is_dry_run, read_trace, would_do, write_private

REPORT_FILE = "report.html"
SHOT_WIDTH = 1280  # embedded screenshots are scaled down to this width (the PNG beside the report is raw)
THUMB_WIDTH = 160
STEP_PNG = re.compile(r"step-\d{3,}\.png")
POINTER_KINDS = ("left_click", "right_click", "middle_click", "double_click", "triple_click", "mouse_move")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _jpeg_uri(im) -> str:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _scaled(im, width: int):
    if im.width <= width:
        return im
    # reducing_gap: a cheap integer reduction first, then a good filter; ~2x faster than LANCZOS alone
    return im.resize((width, max(1, round(im.height * width / im.width))), Image.Resampling.BICUBIC, reducing_gap=2.0)


def _pictures(png: Path) -> tuple[str, str] | None:
    """(the screenshot, its thumbnail) as JPEG data: URIs, decoded once; None when it cannot be read."""
    try:
        with Image.open(png) as im:
            shot = _scaled(im.convert("RGB"), SHOT_WIDTH)
            return _jpeg_uri(shot), _jpeg_uri(_scaled(shot, THUMB_WIDTH))
    except (OSError, ValueError):
        return None


def _step_failed(step: dict) -> bool:
    return bool(step.get("error")) or any(not r.get("ok", True) for r in step.get("results", []))


def _point(pixel, screen: dict) -> tuple[float, float]:
    """A physical desktop pixel -> the screenshot's own pixel (what the SVG viewBox uses)."""
    return float(pixel[0]) - float(screen.get("left") or 0), float(pixel[1]) - float(screen.get("top") or 0)


def _markers(step: dict, width: float, height: float) -> str:
    """SVG shapes for every action of the step that touches the screen, numbered in order."""
    screen = step.get("screen") or {}
    r = max(width, height) / 64
    shapes = []
    actions = step.get("actions") or []
    for i, result in enumerate(step.get("results") or []):
        args = actions[i] if i < len(actions) else {}
        kind = str(args.get("action", str(result.get("action", "")).split(" ")[0]))
        points = [_point(p, screen) for p in result.get("pixels") or []]
        cls = "marker " + ("failed" if not result.get("ok", True) else "ok")
        attrs = f'data-step="{_e(step.get("step"))}" data-action="{_e(kind)}"'
        label = f'<text x="{{x:.1f}}" y="{{y:.1f}}" class="num" font-size="{r * 1.6:.1f}">{i + 1}</text>'
        if kind in POINTER_KINDS and points:
            x, y = points[0]
            hollow = " hollow" if kind == "mouse_move" else ""
            shapes.append(
                f'<g class="{cls} click{hollow}" {attrs} data-x="{x:.0f}" data-y="{y:.0f}">'
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}"/><circle cx="{x:.1f}" cy="{y:.1f}" r="{r / 4:.1f}"/>'
                + label.format(x=x + r * 1.2, y=y - r * 1.2)
                + "</g>"
            )
        elif kind == "left_click_drag" and points:
            (x1, y1), (x2, y2) = (points[0], points[-1]) if len(points) > 1 else (points[0], points[0])
            shapes.append(
                f'<g class="{cls} drag" {attrs} data-x="{x2:.0f}" data-y="{y2:.0f}">'
                f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" marker-end="url(#arrow)"/>'
                f'<circle cx="{x1:.1f}" cy="{y1:.1f}" r="{r / 2:.1f}"/>' + label.format(x=x2 + r, y=y2 - r) + "</g>"
            )
        elif kind in ("scroll", "hscroll"):
            x, y = points[0] if points else (width / 2, height / 2)
            amount = float(args.get("pixels") or 0)
            length = r * 5 * (1 if amount >= 0 else -1)
            # positive scrolls up (or right): the arrow points where the content moves the view
            x2, y2 = (x + length, y) if kind == "hscroll" else (x, y - length)
            shapes.append(
                f'<g class="{cls} scroll" {attrs} data-x="{x:.0f}" data-y="{y:.0f}">'
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" marker-end="url(#arrow)"/>'
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r / 2:.1f}"/>' + label.format(x=x + r, y=y + r) + "</g>"
            )
    return "".join(shapes)


def _timings(step: dict) -> str:
    t = step.get("timings") or {}
    parts = [f"{name} {t[key]:.0f} ms" for name, key in (("capture", "capture_ms"), ("model", "model_ms"),
             ("act", "act_ms"), ("total", "total_ms")) if isinstance(t.get(key), int | float)]  # fmt: skip
    if step.get("capture") == "reused":  # no grab of its own: the screen grabbed when the last step settled
        parts = ["capture reused", *(p for p in parts if not p.startswith("capture "))]
    return " · ".join(parts) or "no timings"


def _verdict(step: dict, mode: str) -> str:
    refused = [r for r in step.get("results") or [] if r.get("guard") == "refused"]
    if refused:
        return f'<span class="bad">refused</span>: {_e(refused[0].get("message", ""))}'
    if step.get("results"):
        return f"allowed ({_e(mode)} mode)"
    return "no action reached the guard"


def _heal_html(step: dict) -> str:
    """A healed step of `replay --heal`: the failing locator, what the model was asked, the new locator (the
    point it named is the click marker on the screenshot), or why it was not healed."""
    heal = step.get("heal")
    if not isinstance(heal, dict):
        return ""
    problem = heal.get("problem")
    rows = [
        ("Script step", heal.get("step")),
        ("Failing locator", heal.get("failing")),
        ("Why it failed", heal.get("error")),
        ("The model was asked for", heal.get("asked")),
        ("New locator", heal.get("locator")),
        ("Found", heal.get("role")),
        ("Not healed", problem),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in rows if v not in ("", None))
    title = (
        "Not healed"
        if problem
        else ("Healed: a covering layer is dismissed" if heal.get("kind") == "cover" else "Healed")
    )
    return f'<div class="{"heal failed" if problem else "heal"}"><h3>{_e(title)}</h3><table>{body}</table></div>'


def _dialog_text(dialog: dict) -> str:
    how = "accepted" if dialog.get("accept") else "dismissed"
    if dialog.get("accept") and isinstance(dialog.get("text"), str):
        how += f" with the text {dialog['text']!r}"
    why = f" ({dialog['why']})" if dialog.get("why") else ""
    return (
        f"{dialog.get('type', '?')} dialog {json.dumps(str(dialog.get('message', '')), ensure_ascii=False)}: {how}{why}"
    )


def _dialogs_html(step: dict) -> str:
    """A browser run's dialogs in this step: the one this step answered, those its actions opened, and
    those dismissed without a turn (the start page's, or past the step limit)."""
    items = []
    if isinstance(step.get("dialog"), dict):
        answered = (step.get("results") or [{}])[0].get("detail", {}).get("dialog", step["dialog"])
        during = f" — opened while {answered['during']} ran" if answered.get("during") else ""
        items.append(f"This step answers the {_dialog_text(answered)}{during}")
    for result in step.get("results") or []:
        for dialog in (result.get("detail") or {}).get("dialogs") or []:
            items.append(f"{result.get('action', '')} opened a {_dialog_text(dialog)}")
    for dialog in [*(step.get("dialogs_before") or []), *(step.get("dialogs") or [])]:
        items.append(f"A {_dialog_text(dialog)}")
    if not items:
        return ""
    return '<h3>Dialogs</h3><ul class="dialogs">' + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>"


def _by(step: dict, person_took_part: bool) -> str:
    """Whose step it was, where a person took part in the run (a run of the agent alone needs no label)."""
    if not person_took_part:
        return ""
    return f' <span class="by">{"by the person" if step.get("by") == "person" else "by the agent"}</span>'


def _step_html(step: dict, trace: Trace, mode: str, person_took_part: bool) -> tuple[str, str]:
    """(the step's section, its timeline thumbnail)."""
    n = _e(step.get("step", "?"))
    heal = step.get("heal") if isinstance(step.get("heal"), dict) else {}
    # A heal is titled by the script's own step number, as the script's intent lines and its failures say it.
    label = _e(heal["step"]) if type(heal.get("step")) is int else n
    title = f"Script step {label}" if label is not n else f"Step {n}"
    failed = _step_failed(step)
    screen = step.get("screen") or {}
    png = step.get("screenshot")
    # only the run's own step PNGs: a doctored trace must not pull other files into the page
    path = trace.dir / png if isinstance(png, str) and STEP_PNG.fullmatch(png) else None
    uri, thumb = (_pictures(path) if path is not None else None) or (None, None)
    width, height = float(screen.get("width") or 0), float(screen.get("height") or 0)
    if uri and width and height:
        picture = (
            f'<a class="shot" href="{_e(png)}" title="open the raw screenshot">'
            f'<img src="{uri}" alt="step {n} screenshot" width="{width:.0f}" height="{height:.0f}">'
            f'<svg viewBox="0 0 {width:.0f} {height:.0f}" preserveAspectRatio="none">'
            f"{_markers(step, width, height)}</svg></a>"
        )
    elif isinstance(step.get("no_screenshot"), str) and not png:
        picture = f'<p class="missing">no screenshot: {_e(step["no_screenshot"])}</p>'
    else:
        picture = f'<p class="missing">screenshot {_e(png or "")} is missing</p>'
    results = "".join(
        f'<li class="{"ok" if r.get("ok", True) else "bad"}">{"ok" if r.get("ok", True) else "failed"}: '
        f"{_e(r.get('action', ''))}"
        + (f" at {_e(', '.join(f'({p[0]}, {p[1]})' for p in r['pixels']))}" if r.get("pixels") else "")
        + f" — {_e(r.get('message', ''))}</li>"
        for r in step.get("results") or []
    )
    actions = "".join(
        f"<li><code>{_e(json.dumps(a, ensure_ascii=False))}</code></li>" for a in step.get("actions") or []
    )
    error = f'<p class="error">Fed back to the model: {_e(step["error"])}</p>' if step.get("error") else ""
    error += _heal_html(step) + _dialogs_html(step)
    section = (
        f'<section class="step{" failed" if failed else ""}" id="step-{n}">'
        f"<h2>{title}{_by(step, person_took_part)}"
        f'<span class="timings">{_e(_timings(step))}</span></h2>{picture}'
        f'<div class="details"><h3>Model reply</h3><pre class="reply">{_e(step.get("reply", ""))}</pre>'
        f'<h3>Parsed actions</h3><ul class="actions">{actions or "<li>none</li>"}</ul>'
        f'<h3>Guard</h3><p class="guard">{_verdict(step, mode)}</p>'
        f'<h3>Results</h3><ul class="results">{results or "<li>none</li>"}</ul>{error}</div></section>'
    )
    img = f'<img src="{thumb}" alt="step {n}">' if thumb else '<span class="missing">no image</span>'
    who = " (person)" if step.get("by") == "person" else ""
    strip = f'<a class="thumb{" failed" if failed else ""}" href="#step-{n}">{img}<span>{label}{who}</span></a>'
    return section, strip


def render_report(trace: Trace) -> str:
    """The whole report page for a trace, as one HTML string."""
    run, end = trace.run, trace.end
    mode = str(run.get("mode", "?"))
    sections, strip = [], []
    person_took_part = any(step.get("by") == "person" for step in trace.steps)
    for step in trace.steps:
        section, thumb = _step_html(step, trace, mode, person_took_part)
        sections.append(section)
        strip.append(thumb)
    status = end.get("status", "?") if end else "unfinished"
    dry = is_dry_run(trace)
    shown = f"{status} (dry run: nothing was clicked or typed)" if dry else status
    if status == "dry_run":
        shown = "dry run finished (nothing was clicked or typed)"
    planned = would_do(trace)
    rows = [
        ("Task", run.get("task", "?")),
        ("Outcome", f"{shown}: {end.get('message', '')}" if end else "the run did not finish (crashed or running)"),
        ("Answer", end.get("answer") if end else ""),
        ("Would have run", "; ".join(f"{i}. {what}" for i, what in enumerate(planned, start=1)) if dry else ""),
        ("Steps", len(trace.steps)),
        ("Engine", run.get("engine", "?")),
        ("Executor", f"{run.get('executor', '?')}, {mode} mode"),
        ("Started", run.get("started", "?")),
        ("Finished", end.get("finished", "") if end else ""),
    ]
    if trace.damaged_lines:
        rows.append(("Note", f"{trace.damaged_lines} damaged line(s) in the trace were skipped"))
    summary = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows if v not in ("", None))
    if (trace.dir / PLAYWRIGHT_TRACE).is_file():  # DOM snapshots, network and console of a browser run
        summary += (
            f'<tr><th>Playwright trace</th><td><a href="{PLAYWRIGHT_TRACE}">{PLAYWRIGHT_TRACE}</a> '
            f"(open it with <code>playwright show-trace {_e(trace.dir / PLAYWRIGHT_TRACE)}</code>)</td></tr>"
        )
    template = Template(resources.files("qvl_agent").joinpath("web/report.html").read_text(encoding="utf-8"))
    return template.substitute(
        title=_e(f"qvl-agent {'dry run' if dry else 'run'}: {run.get('task', trace.dir.name)}"),
        outcome_class="dry" if dry else "ok" if status == "success" else "bad",
        summary=summary,
        timeline="".join(strip) or "<p>No steps were recorded.</p>",
        steps="".join(sections),
    )


def write_report(directory: str | os.PathLike) -> Path:
    """Write `report.html` into the run folder (atomically) and return its path."""
    trace = read_trace(directory)
    page = render_report(trace)
    path = trace.dir / REPORT_FILE
    try:
        write_private(path, page)
    except OSError as exc:
        raise InputError(f"Cannot write the report to {path}: {exc.strerror or exc}.") from None
    return path
