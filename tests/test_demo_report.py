"""`scripts/demo` ends with plain words about what its two-question conversation showed."""

from __future__ import annotations

import json

from qvl_agent.devtools.demo import main, read_stats, report

FIRST = {"vision": "miss", "vision_ms": 41.2, "prefill_tokens": 2065, "prompt_tokens": 2065, "ttft_ms": 220.4}
FOLLOW = {"vision": "hit", "vision_ms": 0.0, "prefill_tokens": 33, "prompt_tokens": 2161, "ttft_ms": 10.6}


def test_random_weights_are_called_noise_and_the_reuse_is_given_in_figures(tmp_path, capsys):
    stats = tmp_path / "stats.txt"
    stats.write_text("loading...\n" + json.dumps(FIRST) + "\n" + json.dumps(FOLLOW) + "\n")
    assert main([str(stats), "--random-weights"]) == 0
    text = capsys.readouterr().out
    assert "random weights" in text and "noise" in text
    assert "prefilled 33 of 2161 tokens" in text
    assert "First token: 220 ms -> 11 ms." in text
    assert "hf download Qwen/Qwen3-VL-2B-Instruct --local-dir DIR, then MODEL=DIR scripts/demo" in text


def test_real_weights_skip_the_noise_warning_and_a_miss_is_said_plainly():
    text = report([FIRST, FOLLOW], random_weights=False)
    assert "noise" not in text and "hf download" not in text
    text = report([FIRST, {**FOLLOW, "vision": "miss", "prefill_tokens": 2161}], random_weights=False)
    assert "did NOT reuse" in text and "2161 of 2161" in text
    assert "nothing to compare" in report(read_stats("qvl-agent: out of memory\n"), random_weights=True)
