"""A test-only engine that plays MiniWoB++ tasks by reading the live page's DOM.

`DomOracle.attach(executor)` (the harness's `on_start` hook) gives it the episode's page; on each turn
it answers the next step of a plan made from the page and the utterance, as a Qwen3-VL `computer_use`
tool call on the 0-1000 grid of the viewport, one action per turn, exactly as the model would reply.
It knows click-button, click-checkboxes and enter-text.
"""

from __future__ import annotations

import json
import re

from qvl_agent.engine.base import Engine, Session, TurnStats


def _call(**arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": arguments}) + "\n</tool_call>"


class DomOracle(Engine):
    name = "dom-oracle"

    def __init__(self):
        self.page = None
        self.plan: list[str] = []

    def attach(self, executor) -> None:
        self.page = executor.page
        self.plan = self._make_plan()

    def _click(self, selector: str) -> str:
        box = self.page.locator(selector).first.bounding_box()
        view = self.page.viewport_size
        x = (box["x"] + box["width"] / 2) * 1000 / view["width"]
        y = (box["y"] + box["height"] / 2) * 1000 / view["height"]
        return _call(action="left_click", coordinate=[round(x, 1), round(y, 1)])

    def _make_plan(self) -> list[str]:
        task = self.page.url.rsplit("/", 1)[-1].removesuffix(".html")
        utterance = self.page.evaluate("() => core.getUtterance()")
        if task == "click-button":
            label = re.search(r'"(.+?)"', utterance).group(1)
            return [self._click(f'#area button:text-is("{label}")')]
        if task == "click-checkboxes":
            names = utterance.removeprefix("Select ").removesuffix(" and click Submit.")
            wanted = {n.strip() for n in names.split(",") if n.strip() and n.strip() != "nothing"}
            plan = []
            for i in range(self.page.locator("#boxes input[type=checkbox]").count()):
                text = self.page.locator("#boxes label").nth(i).inner_text().strip()
                if text in wanted:
                    plan.append(self._click(f"#ch{i}"))
            return plan + [self._click("#subbtn")]
        if task == "enter-text":
            text = re.search(r'"(.+?)"', utterance).group(1)
            return [self._click("#tt"), _call(action="type", text=text), self._click("#subbtn")]
        raise ValueError(f"the DOM oracle does not know {task}")

    def open_session(self, images=(), system=None, tools=None) -> Session:
        return _OracleSession(self, images, system, tools)


class _OracleSession(Session):
    def __init__(self, engine: DomOracle, images, system, tools):
        super().__init__(images, system, tools)
        self.engine = engine

    def _generate(self, text, images, options):
        plan = self.engine.plan
        reply = plan.pop(0) if plan else _call(action="terminate", status="success")
        yield reply
        self.last_stats = TurnStats(vision="miss" if images else "none", decode_tokens=len(reply.split()))
