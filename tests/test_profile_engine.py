"""`scripts/profile_engine.py` on a CPU with the tiny model: the profiler CI keeps working.

A person reads from it which phase costs what: every phase of a real turn found and timed, the decode
phase with one step per decoded token after the first, the speculative verify steps present, and the
host-side table naming where a decoded token's time went."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_profile_reports_every_phase_of_a_real_turn(tiny_model_dir, tmp_path):
    out = tmp_path / "profile.json"
    tokens = 12
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_engine.py"), "--device", "cpu", "--model",
         str(tiny_model_dir), "--tokens", str(tokens), "--screen", "640x480", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    phases = report["phases"]
    assert set(phases) == {"vision", "prefill", "decode", "chain", "verify"}
    # The profiled pass decodes `tokens` tokens with speculation off (the first comes from the prefill),
    # one step per replay, then again in chains of several steps, then a forced tool call whose drafts
    # are checked in verify steps.
    assert phases["decode"]["steps"] >= tokens - 1
    assert 1 <= phases["chain"]["steps"] < tokens - 1
    assert phases["verify"]["steps"] >= 1 and phases["vision"]["steps"] >= 2  # two fresh screenshots
    for p in phases.values():
        assert p["wall_ms_per_step"] > 0 and p["kernel_ms_per_step"] > 0 and p["top"]
        assert p["kernel_ms_per_step"] <= p["wall_ms_per_step"] * 1.01  # ops run inside their phase
    host = report["host_ms_per_token"]
    assert host["chained steps + their sync"] > 0 and host["detokenise + stop check"] > 0
    assert "top kernels, decode" in r.stdout and "host time per decoded token" in r.stdout


def test_profile_refuses_a_token_count_out_of_range():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_engine.py"), "--device", "cpu", "--tokens", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "--tokens must be between 2 and 4096" in r.stderr
