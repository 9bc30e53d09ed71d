"""`qvl-agent ask` as a user runs it: answers stream, follow-ups reuse, bad input exits 2 in one sentence."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_cli


@pytest.fixture(scope="module")
def shot_png(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "shot.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)).save(path)
    return path


QUESTIONS = ("What is this?", "What is this?", "And again?")  # the repeated question's answer can be drafted


def _ask(tiny_model_dir, shot_png, *questions: str, speculate: str) -> tuple[str, list[dict]]:
    """`ask --stats` about the 1080p screenshot: (the answers, one stats object per turn)."""
    r = run_cli("ask", "--model", str(tiny_model_dir), "--image", str(shot_png), "--stats", "--max-new-tokens", "40",
                *questions, env={"QVL_SPECULATE": speculate})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout, [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def conversation(tiny_model_dir, shot_png) -> tuple[str, list[dict]]:
    """Three questions in one `ask`, drafting on (the default)."""
    return _ask(tiny_model_dir, shot_png, *QUESTIONS, speculate="1")


@pytest.mark.slow
@pytest.mark.same_worker
def test_follow_up_questions_one_conversation_with_stats(conversation, tiny_model_dir, shot_png):
    stdout, stats = conversation
    assert len(stats) == len(QUESTIONS)
    for s in stats:
        assert set(s) >= {
            "preprocess_ms",
            "vision",
            "vision_ms",
            "prefill_tokens",
            "ttft_ms",
            "decode_tokens",
            "decode_tokens_per_s",
            "total_ms",
        }
    assert [s["vision"] for s in stats] == ["miss", "hit", "hit"]
    assert all(s["prefill_tokens"] < stats[0]["prefill_tokens"] / 10 for s in stats[1:])
    assert stats[0]["prefill_tokens"] > 2040  # the 1080p screenshot's 2040 visual tokens were prefilled
    assert all(s["decode_tokens"] >= 1 for s in stats)
    # Greedy decoding: asked alone, the first question gets the very answer it got in the conversation.
    alone = run_cli("ask", "--model", str(tiny_model_dir), "--image", str(shot_png), "--max-new-tokens", "40",
                    QUESTIONS[0])  # fmt: skip
    assert alone.returncode == 0 and alone.stdout.strip(), alone.stderr
    assert stdout.startswith(alone.stdout) and len(stdout) > len(alone.stdout)


@pytest.mark.slow
@pytest.mark.same_worker
def test_stats_report_drafted_tokens_and_QVL_SPECULATE_0_turns_drafting_off(conversation, tiny_model_dir, shot_png):
    fast, on = conversation
    plain, off = _ask(tiny_model_dir, shot_png, *QUESTIONS, speculate="0")
    assert fast == plain and fast.strip()  # drafting changes how many forwards run, never the answer
    assert len(on) == len(off) == 3
    assert all(0 <= s["draft_accepted"] < s["decode_tokens"] for s in on)
    assert sum(s["draft_accepted"] for s in on) > 0  # the repeated question's answer was drafted
    assert [s["draft_accepted"] for s in off] == [0, 0, 0]
    assert [s["decode_tokens"] for s in on] == [s["decode_tokens"] for s in off]


def test_replay_engine_streams_recorded_replies_then_says_it_ran_out(tmp_path, shot_png):
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["It is a settings dialog.", "The title is Preferences."]))
    r = run_cli("ask", "--engine", f"replay:{replies}", "--image", str(shot_png), "What?", "Title?")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["It is a settings dialog.", "The title is Preferences."]

    replies.write_text(json.dumps(["Red\x1b[2J\x1b]0;owned\x07 text\r\nnext line"]))
    r = run_cli("ask", "--engine", f"replay:{replies}", "--image", str(shot_png), "What?")
    assert r.stdout == "Red\\x1b[2J\\x1b]0;owned\\x07 text\\r\nnext line\n"  # nothing reaches the terminal raw

    r = run_cli("ask", "--engine", f"replay:{replies}", "--image", str(shot_png), "a", "b", "c")
    assert r.returncode == 2
    assert "no more recorded replies" in r.stderr and "Traceback" not in r.stderr


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, shot_png):
    d = tmp_path_factory.mktemp("bad")
    png = shot_png.read_bytes()
    Image.fromarray(np.zeros((400, 400, 3), np.uint8)).save(d / "ok.jpg")
    jpeg = (d / "ok.jpg").read_bytes()
    Image.new("1", (9000, 8000)).save(d / "bomb.png")  # 72 Mpx in a few kB
    return {
        "missing": (d / "nope.png", "No such image file"),
        "empty": (_write(d / "empty.png", b""), "is empty"),
        "not an image": (_write(d / "notes.png", b"hello, this is text\n" * 20), "is not an image"),
        "truncated png": (_write(d / "cut.png", png[: len(png) // 2]), "truncated or corrupt"),
        "truncated jpeg": (_write(d / "cut.jpg", jpeg[: len(jpeg) // 2]), "truncated or corrupt"),
        "corrupt png": (_write(d / "bad.png", png[:100] + bytes(len(png) - 100)), "truncated or corrupt"),
        "bomb": (d / "bomb.png", "over the limit"),
        "folder": (d, "is a folder"),
    }


@pytest.mark.parametrize(
    "case",
    ["missing", "empty", "not an image", "truncated png", "truncated jpeg", "corrupt png", "bomb", "folder"],
)
def test_bad_image_exits_2_with_one_sentence(bad_inputs, case, tiny_model_dir):
    path, expected = bad_inputs[case]
    r = run_cli("ask", "--model", str(tiny_model_dir), "--image", str(path), "What is this?")
    assert r.returncode == 2, (case, r.stdout, r.stderr)
    assert expected in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_empty_question_exits_2(shot_png, tiny_model_dir):
    r = run_cli("ask", "--model", str(tiny_model_dir), "--image", str(shot_png), "   ")
    assert r.returncode == 2 and "question is empty" in r.stderr and "Traceback" not in r.stderr


def test_monitor_without_screen_exits_2(shot_png):
    r = run_cli("ask", "--engine", "replay:/nonexistent.json", "--image", str(shot_png), "--monitor", "1", "What?")
    assert r.returncode == 2 and "--monitor only applies with --screen" in r.stderr and "Traceback" not in r.stderr


def test_screen_without_display_exits_2():
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["DISPLAY"] = ""
    r = run_cli("ask", "--screen", "What is this?", env=env)
    assert r.returncode == 2 and "no display" in r.stderr.lower() and "Traceback" not in r.stderr


@pytest.mark.slow
def test_missing_model_names_it_and_how_to_point_at_a_copy(shot_png, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = run_cli("ask", "--image", str(shot_png), "What is this?", env=env)
    assert r.returncode == 2
    assert "Qwen/Qwen3-VL-2B-Instruct" in r.stderr and "--model DIR" in r.stderr
    assert "hf download Qwen/Qwen3-VL-2B-Instruct --local-dir DIR" in r.stderr  # a command that exists
    assert "Traceback" not in r.stderr
    r = run_cli("ask", "--model", str(tmp_path / "no-such-dir"), "--image", str(shot_png), "What?")
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.usefixtures("x_display")
def test_screen_capture_on_a_display(tmp_path):
    replies = tmp_path / "r.json"
    replies.write_text(json.dumps(["A desktop."]))
    r = run_cli("ask", "--engine", f"replay:{replies}", "--screen", "--monitor", "1", "What is this?")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "A desktop."
    r = run_cli("ask", "--engine", f"replay:{replies}", "--screen", "--monitor", "7", "What is this?")
    assert r.returncode == 2 and "no monitor 7" in r.stderr
