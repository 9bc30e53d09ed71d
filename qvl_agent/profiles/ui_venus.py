"""UI-Venus-1.5 (inclusionAI), a Qwen3-VL fine-tune: a bare point, and [-1,-1] when it is not there.

From inclusionAI/UI-Venus@c3a1442 `models/grounding/ui_venus1_5_gd.py` (the same text in
`eval_screenspot_pro.py`, whose ScreenSpot-Pro run uses the refusal variant):
- no system message; one user turn, the image and then the prompt of line 75 (`prompts/ui_venus_grounding.txt`,
  pinned by tests/fidelity/ui_venus_1_5_grounding_user.txt), the instruction with one trailing "." removed;
- `_parse_point`: `[x,y]`, the centre of `[x1,y1,x2,y2]` or of `[x1,y1],[x2,y2]`, else the first
  bracket's numbers; divided by 1000; `[-1,-1]` means infeasible;
- greedy, `max_new_tokens=128` in `generate`;
- pixels: qwen_vl_utils' defaults 3,136-12,845,056 (the code sets none; ClawGUI-Eval pins the same).
Agent: UI-Venus's own text actions (`Click(box=(x,y))`, models/navigation/utils.py) are not spoken here.
"""

from __future__ import annotations

from qvl_agent.profiles.base import Profile, Score

PROFILE = Profile(
    name="ui-venus-1.5",
    title="UI-Venus-1.5",
    hf_ids=("inclusionAI/UI-Venus-1.5-2B", "inclusionAI/UI-Venus-1.5-8B"),
    names=("ui-venus", "ui_venus", "uivenus"),
    system_prompt=None,
    user_prompt="ui_venus_grounding",
    reply_format="point",
    max_pixels=12_845_056,
    min_pixels=3_136,
    max_new_tokens=128,
    agent_format="grounding only",
    agent_note="UI-Venus text actions (Click(box=(x,y)), ...), not supported: grounder under --planner",
    scores=(
        Score("ScreenSpot-Pro", "2B", 57.7, 58.82),
        Score("ScreenSpot-Pro", "2B", 64.6, None, "with its zoom-in pass"),
        Score("ScreenSpot-v2", "2B", 92.8, 93.24),
    ),
    sources=(
        "inclusionAI/UI-Venus@c3a1442 models/grounding/ui_venus1_5_gd.py L66-90, _parse_point",
        "inclusionAI/UI-Venus@c3a1442 README.md (scores, + ZoomIn row)",
        "ZJU-REAL/ClawGUI@d990d3e clawgui-eval/README.md (reproduced scores)",
    ),
    zoom_note="README reports +ZoomIn (57.7 -> 64.6 on ScreenSpot-Pro); its crop size and trigger are not published.",
    strip_period=True,
    refusal="[-1,-1]",
)
