"""A planner and a grounder: one model says what to do in words, another says where.

`PlannerEngine(planner, grounder)` is an Engine, so the agent loop runs on it unchanged. Its sessions
are the planner's, whose first user turn also asks it (`prompts/planner_hint.txt`) to name elements
instead of giving coordinates: `{"action": "left_click", "element": "the Save button"}`. Before the
reply leaves the session, every `element` (and a drag's `start_element`) is looked up by the grounder on
the turn's screenshot with the grounder's own profile (prompt, input order, parser) and written into the
call as the `coordinate` on the 0-1000 grid of that screenshot, so the agent parses, guards, acts and
traces it as any computer_use call. When the grounder says the element is not on the screen, or names
no point, the call's coordinate says so in words; the agent's parser rejects it and the planner reads
that sentence as its next observation. Calls that already carry a coordinate are left as they are.

`open_agent_engine` builds what `run` and `browse` talk to: the model itself when its profile speaks
computer_use, else (or with --planner) the pair. Imports no torch, Qt or Playwright.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence

from qvl_agent import prompts
from qvl_agent.config import DEFAULT_MODEL, Settings, replace
from qvl_agent.engine import Engine, GenerationOptions, Session, open_engine
from qvl_agent.errors import EngineError, NotOnScreen, ParseError, UsageError
from qvl_agent.grounding import locate
from qvl_agent.image import Screenshot
from qvl_agent.profiles import choose

_CALL = re.compile(r"(<tool_call>\s*)(.*?)(\s*</tool_call>)", re.S)
_TARGETS = (("element", "coordinate"), ("start_element", "start_coordinate"))
MAX_ELEMENT_CHARS = 300  # a description longer than this is not one element


class PlannerEngine(Engine):
    def __init__(self, planner: Engine, grounder: Engine):
        self.planner = planner
        self.grounder = grounder
        self.profile = grounder.profile  # grounding questions (heal, locate) go to the grounder
        self.name = f"planner {planner.name} + grounder {grounder.name}"

    def open_session(self, images=(), system=None, tools=None) -> PlannerSession:
        return PlannerSession(self, images, system, tools)

    def close(self) -> None:
        try:
            self.planner.close()
        finally:
            self.grounder.close()


class PlannerSession(Session):
    def __init__(self, engine: PlannerEngine, images, system, tools):
        super().__init__(images, system, tools)
        self.engine = engine
        self.inner = engine.planner.open_session(system=system, tools=tools)
        self._screen: Screenshot | None = tuple(images)[-1] if images else None

    def add_turn(self, text: str, images: Sequence[Screenshot] = (), reply: str = "") -> None:
        first = not self.turns and not self.inner.turns
        super().add_turn(text, images, reply)
        self.inner.add_turn(_hinted(text) if first else text, self.turns[-1].images, reply)
        if self.turns[-1].images:
            self._screen = self.turns[-1].images[-1]

    def cancel(self) -> None:
        super().cancel()
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()

    def _generate(self, text: str, images: tuple[Screenshot, ...], options: GenerationOptions) -> Iterator[str]:
        if images:
            self._screen = images[-1]
        question = _hinted(text) if not self.inner.turns else text
        reply = self.inner.complete(question, images, options)
        self.last_stats = self.inner.last_stats
        if self.cancelled:
            yield reply
            return
        yield self._grounded(reply)

    def _grounded(self, reply: str) -> str:
        """The reply with each call's elements replaced by the grounder's points (or by why not)."""

        def one(match: re.Match) -> str:
            try:
                call = json.loads(match.group(2))
            except ValueError:
                return match.group(0)  # the agent's parser says what is wrong with it
            args = call.get("arguments") if isinstance(call, dict) else None
            if not isinstance(args, dict):
                return match.group(0)
            changed = False
            for element_key, point_key in _TARGETS:
                element = args.get(element_key)
                if isinstance(element, str) and point_key not in args:
                    args[point_key] = self._point(element)
                    changed = True
            if not changed:
                return match.group(0)
            return match.group(1) + json.dumps(call, ensure_ascii=False) + match.group(3)

        return _CALL.sub(one, reply)

    def _point(self, element: str) -> list[int] | str:
        grounder = self.engine.grounder
        who = f"The grounder ({grounder.profile.title})"
        element = element.strip()
        if not element or len(element) > MAX_ELEMENT_CHARS:
            return f"{who} needs a short description of one element, not {element[:40]!r}"
        if self._screen is None:
            return f"{who} has no screenshot to look at"
        try:
            found = locate(grounder, self._screen, element)
        except NotOnScreen:
            return f"{who} says {element!r} is not on the screen"
        except ParseError:
            return f"{who} could not find {element!r}"
        return [round(found.model_x), round(found.model_y)]


def _hinted(task: str) -> str:
    return prompts.load("planner_hint").render(task=task)


def check_agent_model(settings: Settings, planner: str | None) -> None:
    """UsageError, before anything starts, when the model cannot drive the agent and no planner is given."""
    profile, _ = choose(settings.model, settings.profile)
    if not planner and not profile.drives_agent:
        raise UsageError(
            f"{profile.title} only grounds here ({profile.agent_note.split(',')[0]}): give it a planner, "
            "e.g. --planner Qwen/Qwen3-VL-4B-Instruct or --planner openai:URL."
        )


def open_agent_engine(settings: Settings, planner: str | None, notify: Callable[[str], None] | None = None) -> Engine:
    """What the agent loop talks to. Without `planner`: the model, which must speak computer_use. With it
    (a model id or folder, openai:URL or replay:FILE): a PlannerEngine, the configured model grounding."""
    check_agent_model(settings, planner)
    if not planner:
        return open_engine(settings, notify=notify)
    spec = planner.strip()
    remote = spec.startswith(("openai:", "replay:"))
    # A served planner is asked for the server's model (its only one); a local one is the model named.
    planner_settings = replace(
        settings, engine=spec if remote else "local", model=DEFAULT_MODEL if remote else spec, profile=""
    )
    planner_profile, _ = choose(planner_settings.model)
    if not planner_profile.drives_agent:
        raise UsageError(
            f"The planner must speak Qwen's computer_use; {spec} is {planner_profile.title}, which only grounds."
        )
    grounder = open_engine(settings, notify=notify)
    try:
        planner_engine = open_engine(planner_settings)
    except RuntimeError as exc:
        grounder.close()
        if "out of memory" in str(exc).lower():
            raise EngineError(
                f"This GPU cannot hold both the planner ({spec}) and the grounder ({settings.model}); serve one "
                "of them elsewhere and pass --planner openai:URL."
            ) from None
        raise
    except BaseException:
        grounder.close()
        raise
    if notify is not None:
        notify(f"planner {planner_engine.name} says what to do; {grounder.profile.title} says where.")
    return PlannerEngine(planner_engine, grounder)
