"""What a model profile is: the published way one GUI model is asked and how its answer is read.

A profile is data: prompt names (files in `prompts/`), flags and numbers, each copied from the model's
official code and cited in its module. `qvl_agent.grounding` turns a profile into requests and reads
replies with the parser the profile names; the engines never see a profile, only what it makes them
send (system prompt, text, image order, pixel budget, sampling). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

REPLY_FORMATS = ("tool_call", "tool_call_last", "point", "answer")
REFUSALS = ("", "[-1,-1]", "terminate")
AGENT_FORMATS = ("computer_use", "grounding only")


@dataclass(frozen=True)
class Score:
    benchmark: str  # "ScreenSpot-Pro", "ScreenSpot-v2"
    size: str  # "2B", "4B"
    reported: float | None  # by the model's authors, None when they did not report it
    reproduced: float | None = None  # by an independent harness (ClawGUI-Eval), None when nobody has
    note: str = ""  # e.g. "with its zoom-in pass"


@dataclass(frozen=True)
class Profile:
    """One model family's published grounding setup.

    `reply_format` names the parser (`qvl_agent.grounding` holds them):
      tool_call       a computer_use call's `coordinate` (Qwen's ScreenSpot-Pro adapter)
      tool_call_last  the last `(x, y)` or `[x, y]` in the reply (GUI-Owl's evaluation)
      point           a bare `[x,y]`; a box gives its centre (UI-Venus's `_parse_point`)
      answer          the first `[x,y]`, after a reasoning block (MAI-UI's `parse_coordinates`)
    `refusal` is how the model says the element is not there: "" (it always guesses), "[-1,-1]", or
    "terminate" (a computer_use terminate call with status failure).
    """

    name: str  # what --profile takes
    title: str  # the family as people write it
    hf_ids: tuple[str, ...]  # published checkpoints
    names: tuple[str, ...]  # lower-case fragments of a model's name or card that pick this profile
    system_prompt: str | None  # a prompt in prompts/, or None: the model gets no system message
    user_prompt: str | None  # a prompt with $instruction, or None: the instruction as it is
    reply_format: str
    max_pixels: int  # the published pixel budget per image
    min_pixels: int
    max_new_tokens: int
    agent_format: str  # "computer_use": drives run/browse itself; "grounding only": needs --planner
    agent_note: str  # the model's own agent format, in words
    scores: tuple[Score, ...]
    sources: tuple[str, ...]  # where every value above comes from (repository@commit:path)
    zoom_note: str  # what its authors publish about zooming in
    strip_period: bool = False  # drop one trailing "." from the instruction first (UI-Venus)
    text_first: bool = False  # the instruction before the image in the user turn (MAI-UI)
    scale: int = 1000  # the reply's grid: x / scale of the image width
    refusal: str = ""
    temperature: float = 0.0

    def __post_init__(self) -> None:
        # Checked when the module defining it is imported: a typo in a profile fails every test at once.
        for value, allowed in ((self.reply_format, REPLY_FORMATS), (self.refusal, REFUSALS),
                               (self.agent_format, AGENT_FORMATS)):  # fmt: skip
            if value not in allowed:
                raise ValueError(f"profile {self.name}: {value!r} is not one of {allowed}")
        if self.scale <= 0 or not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"profile {self.name}: bad scale or pixel budget")

    @property
    def drives_agent(self) -> bool:
        return self.agent_format == "computer_use"
