"""`qvl-agent eval miniwob` on the real MiniWoB++ pages of the `miniwob` package, served on 127.0.0.1 and
driven in real Chromium through the browser loop. A DOM-reading oracle engine must solve the tasks it
knows; a model that only terminates must fail every episode; bad task names are refused."""

from __future__ import annotations

import json

import pytest

from qvl_agent.eval import miniwob
from tests.conftest import run_cli
from tests.support.dom_oracle import DomOracle

pytestmark = [pytest.mark.browser]

TASKS = ["click-button", "click-checkboxes", "enter-text"]


@pytest.mark.slow
def test_a_dom_reading_oracle_solves_every_episode_through_the_browser_loop(tmp_path):
    oracle = DomOracle()
    episodes = miniwob.evaluate(oracle, TASKS, episodes=2, seed=11, out=tmp_path, on_start=oracle.attach, progress=None)
    assert [(e.task, e.seed) for e in episodes] == [(t, s) for t in TASKS for s in (11, 12)]
    assert all(e.success and e.reward > 0 for e in episodes), episodes
    # The episode ended on the page (the run was stopped by the harness), never by running out of steps.
    assert all(e.status == "stopped" and e.steps <= miniwob.MAX_STEPS for e in episodes)
    typed = [e for e in episodes if e.task == "enter-text"]
    assert all(e.steps == 3 for e in typed)  # click the field, type, click Submit
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"{t}#{n}" for t in TASKS for n in (1, 2)]
    assert all(r["success"] for r in rows) and all(r["utterance"] for r in rows)
    lines, table_rows = miniwob.summarize(episodes)
    assert lines[0] == "MiniWoB++: success 100.00% (6/6) over 3 tasks"
    report = miniwob.write_miniwob_report(tmp_path, episodes, lines, table_rows)
    assert "click-checkboxes" in report.read_text()


def test_the_same_seed_gives_the_same_task(tmp_path):
    oracle = DomOracle()
    first = miniwob.evaluate(oracle, ["enter-text"], 1, 5, tmp_path / "a", on_start=oracle.attach, progress=None)
    again = miniwob.evaluate(oracle, ["enter-text"], 1, 5, tmp_path / "b", on_start=oracle.attach, progress=None)
    assert first[0].utterance == again[0].utterance


def test_the_command_counts_a_model_that_does_nothing_as_failing(tmp_path):
    replay = tmp_path / "replies.json"
    done = (
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}\n</tool_call>'
    )
    replay.write_text(json.dumps([done] * 2))
    out = tmp_path / "out"
    result = run_cli(
        "eval",
        "miniwob",
        "--tasks",
        "click-button",
        "--episodes",
        "2",
        "--seed",
        "3",
        "--out",
        str(out),
        "--engine",
        f"replay:{replay}",
    )
    assert result.returncode == 0, result.stderr
    assert "MiniWoB++: success 0.00% (0/2) over 1 tasks" in result.stdout
    assert "click-button: 0.00% (0/2), 1.0 steps" in result.stdout
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["success"] for r in rows] == [False, False] and [r["seed"] for r in rows] == [3, 4]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<tr><th>qvl-agent</th>" in page and f"replay file {replay}" in page  # what was measured, and how
    assert "<td>click-button</td><td>2</td><td>0.00% (0/2)</td><td>1.0</td>" in page  # the printed figures


def test_unknown_tasks_and_bad_counts_are_refused_before_anything_runs(tmp_path):
    bad = run_cli("eval", "miniwob", "--tasks", "click-buton", "--engine", "replay:/nonexistent")
    assert bad.returncode == 2 and "no MiniWoB++ task 'click-buton'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad = run_cli("eval", "miniwob", "--episodes", "0", "--engine", "replay:/nonexistent")
    assert bad.returncode == 2 and "--episodes" in bad.stderr


def test_an_engine_that_fails_stops_the_evaluation_instead_of_scoring_zero(tmp_path):
    """A model server that is down (or a replay that runs out) measured nothing: no success rate is
    printed, one sentence says where it stopped, and the exit status says it did not run."""
    done = (
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}\n</tool_call>'
    )
    replay = tmp_path / "one-reply.json"
    replay.write_text(json.dumps([done]))  # enough for the first episode only
    out = tmp_path / "out"
    args = ("eval", "miniwob", "--tasks", "click-button", "--episodes", "3", "--out", str(out))
    result = run_cli(*args, "--engine", f"replay:{replay}")
    assert result.returncode == 2, result.stderr
    assert "MiniWoB++ stopped at click-button episode 2" in result.stderr and "Traceback" not in result.stderr
    assert "success" not in result.stdout
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in rows] == [1]  # the finished episode is kept
    down = run_cli(*args, "--engine", "openai:http://127.0.0.1:9")
    assert down.returncode == 2 and "Cannot connect" in down.stderr and "success" not in down.stdout


def test_a_task_named_twice_runs_once():
    names = miniwob.pick_tasks(" click-button, enter-text,click-button.html ", miniwob.task_pages())
    assert names == ["click-button", "enter-text"]
