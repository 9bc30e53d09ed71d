"""Each step a person recorded (`qvl-agent record --describe`), said in words by the model from its screenshot.

The words become the step's `reason` in the exported script's `# intent:` line, which is what
`replay --heal` reads when the step breaks: "Cancel order #1002" asks a better question than the locator
alone. The model sees the screenshot the recorder took before the step and the step as the recorder
describes it (the element's role and name, the point); it is asked after the recording, never while the
person works. What it says is masked with the recording's secrets and cut to one line. A step without a
screenshot, or a reply without words, keeps no reason. Imports no torch, Qt or Playwright.
"""

from __future__ import annotations

from pathlib import Path

from qvl_agent import prompts
from qvl_agent.engine.base import Engine, GenerationOptions
from qvl_agent.errors import InputError
from qvl_agent.image import load_image
from qvl_agent.secrets import Secrets
from qvl_agent.trace import Trace

MAX_WORDS = 120  # characters: one line of intent
OPTIONS = GenerationOptions(max_new_tokens=48)


def question(record: dict) -> str:
    """What the model is asked about one recorded step."""
    result = (record.get("results") or [{}])[0]
    action = (record.get("actions") or [{}])[0]
    point = action.get("coordinate")
    where = f" (at {point[0]}, {point[1]} on a 1000x1000 grid over the screenshot)" if point else ""
    return prompts.load("record_intent").render(action=str(result.get("action", "")), point=where)


def one_line(reply: str) -> str:
    for line in reply.splitlines():
        line = line.strip().strip('"').strip()
        if line:
            return line if len(line) <= MAX_WORDS else line[: MAX_WORDS - 1] + "…"
    return ""


def describe_steps(engine: Engine, trace: Trace, secrets: Secrets) -> dict[int, str]:
    """{step number: the step's intent in words} for the person's steps of `trace`."""
    words: dict[int, str] = {}
    for record in trace.steps:
        name = record.get("screenshot")
        if record.get("by") != "person" or not isinstance(name, str) or Path(name).name != name:
            continue
        try:
            shot = load_image(trace.dir / name)
        except InputError:
            continue  # a picture that is missing or damaged: that step goes without words
        session = engine.open_session()
        try:
            said = one_line(secrets.mask(session.complete(question(record), [shot], OPTIONS)))
        finally:
            session.close()
        if said:
            words[record["step"]] = said
    return words
