"""MAI-UI (Tongyi-MAI), a Qwen3-VL fine-tune that reasons first, with the text before the image.

From Tongyi-MAI/MAI-UI@4dd07b9 `evaluation/grounding/eval_server.py` (the ScreenSpot evaluation;
`models/MAI_UI.py` holds the same text):
- system: `SYSTEM_PROMPT`, ending "## Input instruction\n" (`prompts/mai_ui_grounding.txt`, pinned by
  tests/fidelity/mai_ui_grounding_system.txt); the runtime agent's copy (src/prompt.py) lacks that line;
- user: the instruction plus "\n", THEN the image;
- reply `<grounding_think>...</grounding_think><answer>{"coordinate": [x,y]}</answer>`, read by
  `parse_coordinates`: the first `[x,y]`, divided by 1000 (the runtime agent divides by 999; the
  evaluation, which the scores come from, by 1000); no refusal form;
- temperature 0, `max_tokens=256`; pixels 1,024-6,553,600 (`--max_pixels 6553600` in its README).
Agent: MAI-UI's `mobile_use` tool is for phones only: grounder under --planner here.
"""

from __future__ import annotations

from qvl_agent.profiles.base import Profile, Score

PROFILE = Profile(
    name="mai-ui",
    title="MAI-UI",
    hf_ids=("Tongyi-MAI/MAI-UI-2B", "Tongyi-MAI/MAI-UI-8B"),
    names=("mai-ui", "mai_ui", "maiui"),
    system_prompt="mai_ui_grounding",
    user_prompt="mai_ui_grounding_user",
    reply_format="answer",
    max_pixels=6_553_600,
    min_pixels=1_024,
    max_new_tokens=256,
    agent_format="grounding only",
    agent_note="MAI-UI's mobile_use tool (phones only), not supported: grounder under --planner",
    scores=(
        Score("ScreenSpot-Pro", "2B", 57.4, 57.94),
        Score("ScreenSpot-v2", "2B", 92.5, 92.30),
    ),
    sources=(
        "Tongyi-MAI/MAI-UI@4dd07b9 evaluation/grounding/eval_server.py L20-30, L82-91, parse_coordinates",
        "Tongyi-MAI/MAI-UI@4dd07b9 evaluation/grounding/README.md (--max_pixels 6553600)",
        "ZJU-REAL/ClawGUI@d990d3e clawgui-eval/README.md (reproduced scores)",
    ),
    zoom_note='README: reached "without any zoom-in tricks".',
    text_first=True,
)
