"""GUI-Owl-1.5 (mPLUG / Tongyi, Mobile-Agent-v3.5), a Qwen3-VL fine-tune answering with a tool call.

From X-PLUG/MobileAgent@11cea57 `Mobile-Agent-v3.5/grounding_and_kb/eval_grounding_benchmarks.py`:
- system: `only_two_action_system_prompt` (L39: a computer_use tool limited to left_click and
  mouse_move at 1000x1000, no "helpful assistant" line; `prompts/gui_owl_grounding.txt`, pinned by
  tests/fidelity/gui_owl_1_5_grounding_system.txt); user: the image, then the instruction as given;
- the infeasible suffix (terminate with status failure) is added for OSWorld-G only, not for the
  ScreenSpot runs the scores come from: left out of the prompt, but such a reply reads as a refusal;
- the reply's LAST `(x, y)`, else its last `[x, y]`, on the 0-1000 grid;
- temperature 0.01 with top_k 1 (greedy), `max_new_tokens=2048`; at most 9,800 visual tokens of 32x32
  pixels = 10,035,200 px, at least one (`make_qwen_image_item(max_tokens=9800, patch_size=16)`).
Agent: GUI-Owl's PC agent (computer_use plus `interact`, computer_use/utils.py) is not reproduced here.
"""

from __future__ import annotations

from qvl_agent.profiles.base import Profile, Score

PROFILE = Profile(
    name="gui-owl-1.5",
    title="GUI-Owl-1.5",
    hf_ids=("mPLUG/GUI-Owl-1.5-2B-Instruct", "mPLUG/GUI-Owl-1.5-4B-Instruct"),
    names=("gui-owl", "gui_owl", "guiowl"),
    system_prompt="gui_owl_grounding",
    user_prompt=None,
    reply_format="tool_call_last",
    max_pixels=10_035_200,
    min_pixels=1_024,
    max_new_tokens=2048,
    agent_format="grounding only",
    agent_note="GUI-Owl's PC prompt (computer_use plus interact) is not reproduced: grounder under --planner",
    scores=(
        Score("ScreenSpot-Pro", "2B", 57.8, 56.36),
        Score("ScreenSpot-v2", "2B", 89.7, 89.23),
        Score("ScreenSpot-Pro", "4B", 66.8, 66.16),
        Score("ScreenSpot-v2", "4B", 93.2, 92.53),
    ),
    sources=(
        "X-PLUG/MobileAgent@11cea57 Mobile-Agent-v3.5/grounding_and_kb/eval_grounding_benchmarks.py"
        " L39-44, L330-410, L630-642",
        "ZJU-REAL/ClawGUI@d990d3e clawgui-eval/README.md L457-458 (reported and reproduced scores)",
    ),
    zoom_note="The evaluation has a use_crop_tool flag that the released code never uses: no published procedure.",
    refusal="terminate",
)
