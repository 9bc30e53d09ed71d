"""Model profiles: each GUI model is shown exactly what its authors' code shows it, and its answer is read
the way their code reads it.

`tests/fidelity/` keeps copies of the official texts, each taken byte for byte from the file named here:
- ui_venus_1_5_grounding_user.txt: inclusionAI/UI-Venus@c3a1442c3c4501af18c124458dbbddcbda5c2c6f
  models/grounding/ui_venus1_5_gd.py line 75 (the `prompt` string with the refusal clause; `{}` is the
  instruction), https://github.com/inclusionAI/UI-Venus/blob/c3a1442/models/grounding/ui_venus1_5_gd.py
- mai_ui_grounding_system.txt: Tongyi-MAI/MAI-UI@4dd07b9e910a294f001452e888514d912b96cc41
  evaluation/grounding/eval_server.py `SYSTEM_PROMPT` (lines 20-30),
  https://github.com/Tongyi-MAI/MAI-UI/blob/4dd07b9/evaluation/grounding/eval_server.py
- gui_owl_1_5_grounding_system.txt: X-PLUG/MobileAgent@11cea575561fb7800b5fb6b6cafa56f7a91de11f
  Mobile-Agent-v3.5/grounding_and_kb/eval_grounding_benchmarks.py `only_two_action_system_prompt` (line 39),
  https://github.com/X-PLUG/MobileAgent/blob/11cea57/Mobile-Agent-v3.5/grounding_and_kb/eval_grounding_benchmarks.py
- screenspot_pro_qwen3vl_system.txt: Qwen3-VL's (see test_fidelity.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qvl_agent import profiles
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.errors import NotOnScreen, ParseError, UsageError
from qvl_agent.grounding import locate, point_in_reply, system_prompt, user_text
from qvl_agent.image import Screenshot

OFFICIAL = Path(__file__).resolve().parent / "fidelity"
VENUS, MAI, OWL, QWEN = (profiles.get(n) for n in ("ui-venus-1.5", "mai-ui", "gui-owl-1.5", "qwen3-vl"))


def official(name: str) -> str:
    return (OFFICIAL / name).read_text(encoding="utf-8")


def shot(width: int = 1366, height: int = 768, left: int = 0, top: int = 0) -> Screenshot:
    return Screenshot(bytes([9, 8, 7]) * (width * height), width, height, "RGB", left=left, top=top)


# --- prompts, byte for byte -----------------------------------------------------------------------------


def test_ui_venus_gets_no_system_prompt_and_its_user_text_byte_for_byte():
    assert system_prompt(VENUS) is None
    template = official("ui_venus_1_5_grounding_user.txt")
    # Its code drops one trailing "." from the instruction, then fills the template with str.format.
    assert user_text("the Save button.", VENUS) == template.format("the Save button")
    assert user_text("Open settings", VENUS) == template.format("Open settings")
    assert user_text("e.g..", VENUS) == template.format("e.g.")
    assert template.endswith("the output should be [-1,-1].")


def test_mai_ui_system_prompt_byte_for_byte_and_the_instruction_ends_with_a_newline():
    assert system_prompt(MAI) == official("mai_ui_grounding_system.txt")
    assert system_prompt(MAI).endswith("## Input instruction\n")
    assert user_text("the Save button.", MAI) == "the Save button." + "\n"  # `instruction + "\n"`, as given
    assert MAI.text_first


def test_gui_owl_system_prompt_byte_for_byte_and_the_instruction_as_given():
    assert system_prompt(OWL) == official("gui_owl_1_5_grounding_system.txt")
    assert "You are a helpful assistant" not in system_prompt(OWL)
    assert user_text("the Save button.", OWL) == "the Save button."


def test_qwen3vl_keeps_its_screenspot_pro_adapter_prompt():
    assert system_prompt(QWEN) == system_prompt() == official("screenspot_pro_qwen3vl_system.txt")
    assert user_text("the Save button.", QWEN) == "the Save button."


@pytest.mark.parametrize("profile", list(profiles.PROFILES.values()), ids=list(profiles.PROFILES))
def test_each_engine_request_carries_the_profiles_prompt_order_and_image(profile):
    engine = ReplayEngine(
        [
            "[500,500]"
            if profile is VENUS
            else '<answer>{"coordinate": [500,500]}</answer>'
            if profile is MAI
            else '<tool_call>\n{"name": "computer_use", "arguments": '
            '{"action": "left_click", "coordinate": [500, 500]}}\n</tool_call>'
        ]
    )
    engine.profile = profile
    point = locate(engine, shot(), "the Save button.")
    (request,) = engine.requests
    assert request.system == system_prompt(profile)
    assert request.text == user_text("the Save button.", profile)
    assert request.text_first is profile.text_first
    assert request.image_sizes == [(1366, 768)]
    assert (point.x, point.y) == (683, 384)


# --- replies, each in its model's own format ---------------------------------------------------------------

REPLIES = [
    # profile, reply, expected 0-1000 point
    (VENUS, "[250,750]", (250, 750)),
    (VENUS, " [ 250 , 750 ] ", (250, 750)),
    (VENUS, "[100,200,300,400]", (200, 300)),
    (VENUS, "[100,200], [300,400]", (200, 300)),
    (VENUS, "[250,750] is the button", (250, 750)),
    (
        MAI,
        '<grounding_think>The icon is top left.</grounding_think>\n<answer>\n{"coordinate": [120,80]}\n</answer>',
        (120, 80),
    ),
    (MAI, '<grounding_think>Compare [1,2] and [3,4].</grounding_think><answer>{"coordinate": [5,6]}</answer>', (5, 6)),
    (MAI, '<answer>{"coordinate": [5, 6]', (5, 6)),  # cut off at the token budget
    (
        OWL,
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [640, 360]}}'
        "\n</tool_call>",
        (640, 360),
    ),
    (OWL, "Moving to (10, 20) first, then click at (30, 40)", (30, 40)),
    (OWL, "[1, 2] then [3, 4]", (3, 4)),
    (
        QWEN,
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 999]}}'
        "\n</tool_call>",
        (1, 999),
    ),
]


@pytest.mark.parametrize("profile, reply, expected", REPLIES)
def test_replies_in_the_models_own_format_name_their_point(profile, reply, expected):
    assert point_in_reply(reply, profile) == expected


REFUSALS = [
    (VENUS, "[-1,-1]"),
    (VENUS, "[-1, -1]"),
    (
        OWL,
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "terminate", "status": "failure"}}'
        "\n</tool_call>",
    ),
]


@pytest.mark.parametrize("profile, reply", REFUSALS)
def test_a_profiles_refusal_form_says_not_on_screen(profile, reply):
    with pytest.raises(NotOnScreen) as raised:
        point_in_reply(reply, profile)
    assert "not on the screen" in str(raised.value) and "\n" not in str(raised.value)


MALFORMED = [
    "",
    "   ",
    "I cannot see it.",
    "[x,y]",
    "[1.5,2.5]",
    "<answer></answer>",
    "{" * 5000,
    "[" + "9" * 5000 + "," + "9" * 5000 + "]",
    "\x00\ud800",
    "(1,",
    '{"coordinate": [1, "a"]}',
]


@pytest.mark.parametrize("profile", list(profiles.PROFILES.values()), ids=list(profiles.PROFILES))
@pytest.mark.parametrize("reply", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_reply_is_one_sentence_never_a_traceback(profile, reply):
    try:
        x, y = point_in_reply(reply, profile)
    except ParseError as exc:
        message = str(exc)
        assert message.startswith("The model") and message.endswith(".") and "\n" not in message
        assert len(message) < 300
        return
    # A reply some parser still reads (a huge number) names a point the caller then clamps.
    assert isinstance(x, float) and isinstance(y, float)


def test_qwen3vl_does_not_take_minus_one_as_a_refusal_it_never_learned():
    with pytest.raises(ParseError) as raised:
        point_in_reply("[-1,-1]", QWEN)
    assert not isinstance(raised.value, NotOnScreen)


# --- choosing a profile ---------------------------------------------------------------------------------


def _checkpoint(tmp_path: Path, folder: str, config: dict | None = None, card: str = "") -> str:
    path = tmp_path / folder
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl", **(config or {})}))
    if card:
        (path / "README.md").write_text(card)
    return str(path)


def test_a_model_folder_picks_its_profile_from_its_own_files_and_says_so(tmp_path):
    cases = [
        (_checkpoint(tmp_path, "UI-Venus-1.5-2B"), "ui-venus-1.5", "its folder name"),
        (_checkpoint(tmp_path, "ckpt-a", {"_name_or_path": "Tongyi-MAI/MAI-UI-2B"}), "mai-ui", "its config.json"),
        (
            _checkpoint(tmp_path, "ckpt-b", card="---\nbase_model: Qwen/Qwen3-VL-2B-Instruct\n---\n# GUI-Owl-1.5-2B"),
            "gui-owl-1.5",
            "its model card",
        ),
        (_checkpoint(tmp_path, "Qwen3-VL-4B-Instruct"), "qwen3-vl", "its folder name"),
    ]
    for folder, name, where in cases:
        profile, line = profiles.choose(folder)
        assert profile.name == name
        assert line == f"using the {name} profile ({profile.title}), chosen from {where}."


def test_an_unknown_qwen3vl_checkpoint_gets_the_instruct_profile_with_one_line(tmp_path):
    folder = _checkpoint(tmp_path, "my-finetune")
    profile, line = profiles.choose(folder)
    assert profile is profiles.DEFAULT
    assert "is a Qwen3-VL checkpoint of no known family: using the qwen3-vl profile" in line and "\n" not in line


def test_hub_ids_served_names_and_the_override():
    assert profiles.choose("inclusionAI/UI-Venus-1.5-2B")[0] is VENUS
    assert profiles.choose("mPLUG/GUI-Owl-1.5-4B-Instruct")[0] is OWL
    assert profiles.choose("Qwen/Qwen3-VL-2B-Instruct") == (QWEN, "")  # the default says nothing
    assert profiles.choose("Qwen/Qwen3-VL-2B-Instruct", "MAI-UI") == (MAI, "")
    with pytest.raises(UsageError, match="the profiles are ui-venus-1.5, mai-ui, gui-owl-1.5, qwen3-vl"):
        profiles.get("venus")


def test_broken_model_files_do_not_stop_the_choice(tmp_path):
    folder = tmp_path / "weird"
    folder.mkdir()
    (folder / "config.json").write_text("[not json")
    (folder / "tokenizer_config.json").write_bytes(b"\xff\xfe{")
    (folder / "README.md").write_bytes(b"\x00" * 100)
    profile, line = profiles.choose(str(folder))
    assert profile is profiles.DEFAULT and "no model family qvl-agent knows" in line


def test_doctor_says_which_profile_and_whether_it_needs_a_planner(tmp_path):
    from qvl_agent.commands.doctor import check_profile
    from qvl_agent.config import Settings

    venus = check_profile(Settings(model=_checkpoint(tmp_path, "UI-Venus-1.5-2B")))
    assert venus.detail == (
        "using the ui-venus-1.5 profile (UI-Venus-1.5), chosen from its folder name; "
        "it only grounds: run and browse need --planner."
    )
    assert check_profile(Settings()).detail == (
        "qwen3-vl (Qwen3-VL-Instruct), the default model's profile; it drives run and browse."
    )


def test_models_lists_every_profile_with_its_scores_and_sources():
    from tests.conftest import run_cli

    done = run_cli("models")
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.split("\n\n")
    assert [b.split()[0] for b in blocks] == ["qwen3-vl", "ui-venus-1.5", "mai-ui", "gui-owl-1.5"]
    assert "  ScreenSpot-Pro 2B: reported 48.5, reproduced 43.9" in blocks[0]
    assert "  ScreenSpot-Pro 2B: reported 64.6, reproduced - (with its zoom-in pass)" in blocks[1]
    assert "text, then image" in blocks[2] and "refusal none" in blocks[2]
    assert "source: X-PLUG/MobileAgent@11cea57" in blocks[3]
    listed = json.loads(run_cli("models", "--json").stdout)
    assert [p["name"] for p in listed] == ["qwen3-vl", "ui-venus-1.5", "mai-ui", "gui-owl-1.5"]
    assert listed[2]["text_first"] is True and listed[1]["refusal"] == "[-1,-1]"
