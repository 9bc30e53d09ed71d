"""Qwen3-VL-Instruct (2B, 4B, 8B): the base model, asked the way its ScreenSpot-Pro scores are measured.

Grounding prompt: the public Qwen3-VL adapter of the ScreenSpot-Pro evaluation, byte for byte
(`prompts/grounding.txt`; pinned by tests/test_fidelity.py): a system prompt with a computer_use tool
limited to left_click on a 1000x1000 screen, then the screenshot and the instruction. The reply's
`coordinate` is on the 0-1000 grid. No refusal: the prompt says to guess. Pixel budget: the processor's
own (65,536-16,777,216 px, also ClawGUI-Eval's `qwen3vl_run_transformers.sh`). Greedy.
Agent: Qwen's computer_use tool (cookbooks/computer_use.ipynb), which `run` and `browse` speak.
"""

from __future__ import annotations

from qvl_agent.profiles.base import Profile, Score

PROFILE = Profile(
    name="qwen3-vl",
    title="Qwen3-VL-Instruct",
    hf_ids=("Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"),
    names=("qwen3-vl", "qwen3_vl"),
    system_prompt="grounding",
    user_prompt=None,
    reply_format="tool_call",
    max_pixels=16_777_216,
    min_pixels=65_536,
    max_new_tokens=128,
    agent_format="computer_use",
    agent_note="Qwen's computer_use tool calls (run and browse speak it)",
    scores=(
        Score("ScreenSpot-Pro", "2B", 48.5, 43.9),
        Score("ScreenSpot-v2", "2B", None, 88.92),
        Score("ScreenSpot-Pro", "4B", 59.5, 59.39),
        Score("ScreenSpot-v2", "4B", None, 93.08),
    ),
    sources=(
        "QwenLM/Qwen3-VL cookbooks/computer_use.ipynb (agent prompt; tests/fidelity/qwen3vl_computer_use_system.txt)",
        "the Qwen3-VL adapter of the ScreenSpot-Pro evaluation (tests/fidelity/screenspot_pro_qwen3vl_system.txt)",
        "ZJU-REAL/ClawGUI@d990d3e clawgui-eval/README.md (reproduced scores)",
    ),
    zoom_note="Qwen publishes no zoom-in procedure.",
)
