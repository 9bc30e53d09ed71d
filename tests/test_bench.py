"""`qvl-agent bench` on a CPU with the tiny model: the smoke test CI can run.

It checks what a person reads from the benchmark: every scenario measured on both sides, and the
engine's greedy tokens and first-token logits agreeing with plain transformers' `generate`.
"""

import json

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_bench_runs_on_cpu_and_agrees_with_plain_transformers(tiny_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    r = run_cli(
        "bench", "--device", "cpu", "--model", str(tiny_model_dir), "--reps", "1", "--json", str(out), timeout=600
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    names = [row["scenario"][:3] for row in report["rows"]]
    assert names == ["(e)", "(p)", "(a)", "(b)", "(c)", "(d)", "(f)", "(g)"]
    for row in report["rows"]:
        assert row["engine"] > 0 and row["baseline"] > 0, row
    assert [r["screen"] for r in report["screens"]] == ["1366x768", "1920x1080", "2560x1440", "3840x2160"]
    assert [r["visual_tokens"] for r in report["screens"]] == [1032, 2040, 3600, 8160]
    # Grounding's cost per click, one pass and with the zoom-in pass on a crop of half of each side.
    assert [(r["screen"], r["crop"]) for r in report["zoom"]] == [("1920x1080", "960x540"), ("3840x2160", "1920x1080")]
    for row in report["zoom"]:
        assert row["one_pass_ms"] > 0 and row["zoom_pass_ms"] > 0
        assert abs(row["per_click_with_zoom_ms"] - row["one_pass_ms"] - row["zoom_pass_ms"]) < 0.02
    assert "grounding per click" in r.stdout
    assert report["cuda_graphs"] is False  # the GPU-only paths step aside on a CPU
    assert report["decode_path"] == "eager" and report["compile_s"] is None  # no compile without a GPU
    agreed, total = map(int, report["greedy_tokens_agreeing_with_generate"].split("/"))
    assert agreed == total == 32
    assert report["first_token_max_abs_logit_diff"] < 1e-3
    assert "(b) follow-up" in r.stdout and "speedup" in r.stdout
