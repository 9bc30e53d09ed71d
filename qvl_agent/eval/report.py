"""What every evaluation writes: `results.jsonl` (one JSON object per item or episode) and `report.html`
(what was measured: model, engine, date and qvl-agent version; tables of the figures, then pictures), plus
the latency summary both harnesses print."""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


def default_out_dir(name: str) -> Path:
    """A new folder under the user's data folder: evals/<name>-<date>-<time>-<pid>."""
    import platformdirs

    root = Path(platformdirs.user_data_dir("qvl-agent", appauthor=False)) / "evals"
    return root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def run_facts(settings, engine) -> list[tuple[str, str]]:
    """What a report names so that its figures can be compared with another's: the model, the engine, the
    date and qvl-agent's version."""
    from datetime import UTC, datetime

    from qvl_agent import __version__
    from qvl_agent.engine import describe_engine

    if settings.engine.startswith("replay:"):
        model = "none (recorded replies)"
    elif settings.engine.startswith("openai:"):  # the remote engine knows which of its server's models it asked
        model = str(getattr(engine, "model", "") or settings.model)
    else:
        model = settings.model
    return [
        ("model", model),
        ("engine", describe_engine(settings, engine)),
        *([("profile", engine.profile.name)] if getattr(engine, "profile", None) is not None else []),
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("qvl-agent", __version__),
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0-100) of `values`; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def latency_line(ms: Sequence[float], what: str = "per item") -> str:
    return f"latency {what}: median {percentile(ms, 50):.1f} ms, p90 {percentile(ms, 90):.1f} ms ({len(ms)} measured)"


def rate(hits: int, total: int) -> str:
    return f"{100.0 * hits / total:.2f}% ({hits}/{total})" if total else "n/a (0 items)"


class ResultsWriter:
    """`results.jsonl` in `out`, one line per call of `write`, flushed so a long run can be followed."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "results.jsonl"
        self._file = self.path.open("w", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_report(
    out: Path,
    title: str,
    lines: Sequence[str],
    sections: Sequence[tuple[str, str]],
    facts: Sequence[tuple[str, str]] = (),
) -> Path:
    """`report.html`: the title, the run's `facts` (run_facts), the printed summary `lines`, then each
    (heading, HTML) section."""
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}figure{display:inline-block;margin:8px;"
        "max-width:420px;vertical-align:top}figure img{max-width:400px;border:1px solid #999}"
        "figcaption{font-size:12px}.hit{color:#080}.miss{color:#c00}</style>",
        f"<h1>{html.escape(title)}</h1>",
        "<table class='facts'>"
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
        + "</table>",
        "<pre>" + html.escape("\n".join(lines)) + "</pre>",
    ]
    for heading, content in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{content}")
    path = out / "report.html"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path
