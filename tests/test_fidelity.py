"""What the model is shown is what Qwen3-VL was trained and benchmarked with.

`tests/fidelity/` keeps copies of the official texts: the system prompt that Qwen's computer-use cookbook
renders (QwenLM/Qwen3-VL `cookbooks/computer_use.ipynb` with `cookbooks/utils/agent_function_call.py`,
screen 1000x1000, through qwen-agent's NousFnCallPrompt) and the system prompt of the public Qwen3-VL
adapter of the ScreenSpot-Pro evaluation. The rendered prompts must equal them byte for byte.
The agent's history must never carry screen pixels, and turns whose screenshot was dropped must say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from qvl_agent.act.desktop import DesktopExecutor
from qvl_agent.act.dry_run import DryRunExecutor
from qvl_agent.act.guard import Guard
from qvl_agent.agent import Agent
from qvl_agent.engine.base import SAMPLING_RECIPE, GenerationOptions, sampling_defaults
from qvl_agent.engine.remote import RemoteEngine
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.grounding import point_in_reply, system_prompt
from qvl_agent.image import Screenshot
from qvl_agent.server.protocol import parse_chat_request
from tests.support.recording import RecordingExecutor

OFFICIAL = Path(__file__).resolve().parent / "fidelity"


def screen(n: int) -> Screenshot:
    # An odd size at an odd offset: any pixel coordinate leaking into the text would show as numbers
    # that are not on the 0-1000 grid the model used.
    return Screenshot(bytes([n % 256, 1, 2, 0]) * (1366 * 768), 1366, 768, "BGRA", left=1920, top=37)


def call(**args) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"


def test_desktop_system_prompt_is_the_cookbooks_byte_for_byte():
    agent = Agent(ReplayEngine([]), RecordingExecutor([screen(1)]), Guard(mode="auto"))
    official = (OFFICIAL / "qwen3vl_computer_use_system.txt").read_text(encoding="utf-8")
    assert agent.system_prompt() == official
    assert "(simulated as double-click since it's the closest action)" in official
    assert "(mapped to regular scroll)" in official


def test_browser_system_prompt_is_the_official_tool_text_and_hints_go_to_the_task_turn():
    engine = ReplayEngine([call(action="terminate", status="success")])
    agent = Agent(engine, RecordingExecutor([screen(1)]), Guard(mode="auto"), prompt_name="browser")
    assert agent.run("Press OK").status == "success"
    official = (OFFICIAL / "qwen3vl_computer_use_system.txt").read_text(encoding="utf-8")
    assert engine.requests[0].system == official
    first = engine.requests[0].text
    assert first.startswith("Press OK\n") and "no address bar" in first


def test_grounding_system_prompt_is_the_screenspot_pro_adapters_byte_for_byte():
    official = (OFFICIAL / "screenspot_pro_qwen3vl_system.txt").read_text(encoding="utf-8")
    assert system_prompt() == official
    assert "If you are not sure about where to click, guess a most likely one." in official


def test_grounding_replies_are_read_as_the_adapter_reads_them():
    assert point_in_reply(call(action="left_click", coordinate=[250, 750])) == (250, 750)
    # The adapter takes a four-number coordinate as a box and clicks its centre.
    assert point_in_reply(
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
        '"coordinate": [100, 200, 300, 400]}}\n</tool_call>'
    ) == (200, 300)
    assert point_in_reply('```json\n[{"bbox_2d": [10, 20, 30, 40], "label": "OK"}]\n```') == (20, 30)


def _numbers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", text)}


def test_step_results_carry_no_screen_pixels_only_grid_coordinates():
    replies = [
        call(action="left_click", coordinate=[500, 500]),
        call(action="double_click", coordinate=[100, 900]),
        call(action="left_click_drag", start_coordinate=[10, 10], coordinate=[990, 990]),
        call(action="mouse_move", coordinate=[700, 300]),
        call(action="scroll", pixels=-3, coordinate=[400, 400]),
        call(action="type", text="hello") + call(action="key", keys=["ctrl", "s"]),
        call(action="terminate", status="success"),
    ]

    class FakeInput:  # pyautogui's surface, doing nothing: this test reads what the model is told
        FAILSAFE_POINTS: list = []

        def isValidKey(self, key):  # noqa: N802 (pyautogui's name)
            return True

        def position(self):
            return (0, 0)

        def __getattr__(self, name):
            return lambda *a, **k: None

    shots = iter([screen(i) for i in range(100)])
    desktop = DesktopExecutor(input_backend=FakeInput(), grab=lambda **_: next(shots))
    engine = ReplayEngine(replies)
    agent = Agent(engine, desktop, Guard(mode="auto"), settle_timeout_s=0.0)
    assert agent.run("Do things").status == "success"
    observations = [r.text for r in engine.requests[1:]]
    assert "left_click at (500, 500): clicked" in observations[0]
    assert "type 'hello': typed 5 characters" in observations[5]
    # Pixels of these clicks on a 1366x768 screen at (1920, 37) would be e.g. 2603, 421, 2056, 728...
    pixels = {2603, 421, 2056, 728, 1934, 45, 3272, 797, 2876, 267, 2466, 345}
    for text in observations:
        assert not _numbers(text) & pixels, text


def test_a_dry_run_tells_the_model_nothing_was_done_without_pixels():
    engine = ReplayEngine(
        [call(action="left_click", coordinate=[500, 500]), call(action="terminate", status="success")]
    )
    inner = RecordingExecutor([screen(1), screen(2)])
    agent = Agent(engine, DryRunExecutor(inner), Guard(mode="auto"))
    assert agent.run("Click").status == "dry_run"  # the model ended it as done, but nothing was done
    assert engine.requests[1].text.startswith("left_click at (500, 500): not carried out")
    assert "2603" not in engine.requests[1].text and inner.actions == []


def test_after_a_rebuild_turns_without_their_screenshot_say_it_was_omitted():
    replies = [call(action="mouse_move", coordinate=[i * 10, i * 10]) for i in range(1, 6)] + [
        call(action="terminate", status="success")
    ]
    engine = ReplayEngine(replies)

    sessions = []
    real_open = engine.open_session

    def open_session(*a, **k):
        sessions.append(real_open(*a, **k))
        return sessions[-1]

    engine.open_session = open_session
    agent = Agent(
        engine, RecordingExecutor([screen(i) for i in range(1, 9)]), Guard(mode="auto"), max_images=3, keep_images=2
    )
    assert agent.run("Move around").status == "success"
    assert agent.rebuilds >= 1
    rebuilt = sessions[1]
    turns = rebuilt.turns
    without = [t for t in turns if not t.images]
    with_image = [t for t in turns if t.images]
    assert without and with_image
    for turn in without:
        assert "screenshot of this moment is omitted" in turn.text
        assert "This is the screen now" not in turn.text
    for turn in with_image:
        assert "omitted" not in turn.text
    # The task is still the first turn, and each dropped turn keeps what happened and the model's reply.
    assert turns[0].text.startswith("Move around") and not turns[0].images
    assert turns[1].text.startswith("mouse_move at (10, 10): ") and '"coordinate": [20, 20]' in turns[1].reply


def test_sampling_follows_the_model_card_only_when_it_samples():
    assert sampling_defaults(0.0) == {"top_p": 1.0, "top_k": 0, "presence_penalty": 0.0}
    assert sampling_defaults(0.7) == SAMPLING_RECIPE == {"top_p": 0.8, "top_k": 20, "presence_penalty": 1.5}
    session = RemoteEngine("http://127.0.0.1:9", model="m").open_session()
    session.engine._model = "m"
    sampled = session.request("hi", (), GenerationOptions(temperature=0.7, **sampling_defaults(0.7)))
    extra = sampled["extra_body"]
    assert (sampled["top_p"], extra["top_k"], extra["presence_penalty"]) == (0.8, 20, 1.5)
    greedy = session.request("hi", (), GenerationOptions())
    assert greedy["temperature"] == 0 and "top_k" not in greedy.get("extra_body", {})
    assert "presence_penalty" not in greedy.get("extra_body", {})


def test_the_server_fills_in_the_recipe_for_sampled_requests_and_keeps_what_the_client_sets():
    def options(**body):
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
        return parse_chat_request(json.dumps(body).encode(), 64).options

    sampled = options(temperature=0.7)
    assert (sampled.top_p, sampled.top_k, sampled.presence_penalty) == (0.8, 20, 1.5)
    own = options(temperature=0.7, top_p=0.95, top_k=5, presence_penalty=0.0)
    assert (own.top_p, own.top_k, own.presence_penalty) == (0.95, 5, 0.0)
    greedy = options()
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.presence_penalty) == (0.0, 1.0, 0, 0.0)
