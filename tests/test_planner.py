"""A planner and a grounder: the planner (Qwen3-VL's computer_use) says what to do in words, a grounding
model in its own format says where. Both are replay engines here; the browser run is real Chromium
against pages served on 127.0.0.1."""

from __future__ import annotations

import pytest

from qvl_agent import profiles
from qvl_agent.act.guard import Guard
from qvl_agent.agent import Agent
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.grounding import user_text
from qvl_agent.image import Screenshot
from qvl_agent.planner import PlannerEngine
from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.pages.helpers import ENV, call, element_centres, write_replay
from tests.pages.server import PageServer
from tests.support.recording import RecordingExecutor

VENUS = profiles.get("ui-venus-1.5")


def screen() -> Screenshot:
    return Screenshot(b"\1\2\3" * (1000 * 500), 1000, 500, "RGB", left=0, top=0)


def pair(planner_replies: list[str], grounder_replies: list[str]) -> tuple[PlannerEngine, ReplayEngine, ReplayEngine]:
    planner, grounder = ReplayEngine(planner_replies), ReplayEngine(grounder_replies)
    planner.profile, grounder.profile = profiles.DEFAULT, VENUS
    return PlannerEngine(planner, grounder), planner, grounder


def test_the_planner_names_elements_and_the_grounder_points_in_its_own_format():
    engine, planner, grounder = pair(
        [call(action="left_click", element="the Save button"), call(action="terminate", status="success")],
        ["[250,750]"],
    )
    executor = RecordingExecutor([screen()])
    result = Agent(engine, executor, Guard(mode="auto")).run("Save the file")
    assert result.status == "success"
    (clicked,) = executor.recorded
    assert clicked.action.kind == "left_click" and clicked.pixels == ((250, 375),)
    # The planner was asked to name elements; the grounder got UI-Venus's own question on the same screen.
    assert planner.requests[0].text.startswith("Save the file\n\n(A grounding model finds the elements")
    (asked,) = grounder.requests
    assert asked.system is None and asked.text == user_text("the Save button", VENUS)
    assert asked.image_hashes == planner.requests[0].image_hashes


def test_not_on_screen_becomes_an_observation_for_the_planner():
    engine, planner, _ = pair(
        [
            call(action="left_click", element="the purple elephant"),
            call(action="left_click", coordinate=[500, 500]),
            call(action="terminate", status="success"),
        ],
        ["[-1,-1]"],
    )
    executor = RecordingExecutor([screen()])
    assert Agent(engine, executor, Guard(mode="auto")).run("Click the elephant").status == "success"
    told = planner.requests[1].text
    assert "The grounder (UI-Venus-1.5) says 'the purple elephant' is not on the screen" in told
    assert [r.action.kind for r in executor.recorded] == ["left_click"]


def test_a_grounding_only_model_needs_a_planner_to_drive_a_run(tmp_path):
    replies = write_replay(tmp_path / "r.json", ["[1,1]"])
    done = run_cli("browse", "--url", "http://127.0.0.1:9/", "--engine", f"replay:{replies}", "--profile",
                   "ui-venus-1.5", "--trace-dir", str(tmp_path / "t"), "Sign in", env=ENV)  # fmt: skip
    assert done.returncode == 2
    assert "UI-Venus-1.5 only grounds here" in done.stderr and "--planner" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.browser
def test_a_browser_task_end_to_end_with_a_planner_and_a_grounder(tmp_path):
    server = PageServer().start()
    try:
        url = server.url + "/login.html"
        at = element_centres(url, ["#username", "#password", "text=Remember me", "button"])
        planner = write_replay(tmp_path / "planner.json", [
            call(action="left_click", element="the Username field"),
            call(action="type", text="alice"),
            call(action="left_click", element="the Password field"),
            call(action="type", text="s3cret"),
            call(action="left_click", element="the purple elephant"),
            call(action="left_click", element="the Remember me checkbox"),
            call(action="left_click", element="the Sign in button"),
            call(action="terminate", status="success"),
        ])  # fmt: skip
        # UI-Venus's own answers: bare [x,y] on the 0-1000 grid, [-1,-1] when it is not there.
        points = [at["#username"], at["#password"], [-1, -1], at["text=Remember me"], at["button"]]
        grounder = write_replay(tmp_path / "grounder.json", [f"[{x},{y}]" for x, y in points])
        done = run_cli(
            "browse", "--url", url, "--engine", f"replay:{grounder}", "--profile", "ui-venus-1.5",
            "--planner", f"replay:{planner}", "--export", str(tmp_path / "out.py"),
            "--trace-dir", str(tmp_path / "trace"), "Sign in as alice with password s3cret and stay signed in",
            env=dict(ENV, QVL_CONFIG_DIR=str(tmp_path / "config")), timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "says what to do; UI-Venus-1.5 says where." in done.stderr
        assert server.records("login") == [{"username": "alice", "password": "s3cret", "remember": "yes"}]
        steps = read_trace(tmp_path / "trace").steps
        refused = [s for s in steps if "error" in s]
        assert len(refused) == 1 and "says 'the purple elephant' is not on the screen" in refused[0]["error"]
        clicks = [a for s in steps for a in s.get("actions", []) if a.get("action") == "left_click"]
        assert [c["coordinate"] for c in clicks] == [at["#username"], at["#password"], at["text=Remember me"],
                                                     at["button"]]  # fmt: skip
        assert 'get_by_role("checkbox", name="Remember me", exact=True).check()' in (tmp_path / "out.py").read_text()
    finally:
        server.stop()


def test_a_gpu_that_cannot_hold_both_models_is_said_in_one_sentence(monkeypatch):
    import qvl_agent.planner as planner_module
    from qvl_agent.config import Settings
    from qvl_agent.errors import EngineError

    closed = []

    class Grounder(ReplayEngine):
        def close(self):
            closed.append(self)

    def fake_open_engine(settings, spec=None, notify=None):
        if settings.model == "Qwen/Qwen3-VL-8B-Instruct":  # the planner, loaded second
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        engine = Grounder([])
        engine.profile = VENUS
        return engine

    monkeypatch.setattr(planner_module, "open_engine", fake_open_engine)
    settings = Settings(model="inclusionAI/UI-Venus-1.5-2B")
    with pytest.raises(EngineError) as raised:
        planner_module.open_agent_engine(settings, "Qwen/Qwen3-VL-8B-Instruct")
    assert str(raised.value) == (
        "This GPU cannot hold both the planner (Qwen/Qwen3-VL-8B-Instruct) and the grounder "
        "(inclusionAI/UI-Venus-1.5-2B); serve one of them elsewhere and pass --planner openai:URL."
    )
    assert len(closed) == 1  # the grounder it did load is released


def test_a_planner_that_only_grounds_is_refused():
    from qvl_agent.config import Settings
    from qvl_agent.errors import UsageError
    from qvl_agent.planner import open_agent_engine

    with pytest.raises(UsageError, match="The planner must speak Qwen's computer_use; .* MAI-UI, which only grounds"):
        open_agent_engine(Settings(model="inclusionAI/UI-Venus-1.5-2B"), "Tongyi-MAI/MAI-UI-8B")


def test_hostile_planner_replies_become_observations_never_tracebacks():
    broken = [
        call(action="left_click", element=""),
        call(action="left_click", element="x" * 5000),
        call(action="left_click", element=["not", "a", "string"]),
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "element": "OK"\n</tool_call>',
        "<tool_call>[1, 2]</tool_call>",
        call(action="terminate", status="success"),
    ]
    engine, planner, grounder = pair(broken, [])
    executor = RecordingExecutor([screen()])
    result = Agent(engine, executor, Guard(mode="auto"), max_retries=10).run("Click")
    assert result.status == "success" and executor.recorded == [] and grounder.requests == []
    told = [r.text for r in planner.requests[1:]]
    assert "needs a short description of one element, not ''" in told[0]
    assert "needs a short description of one element" in told[1] and "x" * 100 not in told[1]
    assert all(t.startswith("Your last reply was not carried out: ") for t in told)
