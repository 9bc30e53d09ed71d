"""A test-only grounding model for `replay --heal`: an OpenAI-compatible server on 127.0.0.1 that answers the
grounding question from the page's DOM, in Qwen3-VL's own output format.

It is given the page's URL and what each question means on it (`targets`: a phrase the question must
contain -> the CSS selector of the element a person would pick for it, or a fixed grid point). For each
chat request it checks that the request is the grounding question (the ScreenSpot adapter's system
prompt, one screenshot of the page's viewport size), finds the first phrase the question contains, opens
the URL in a browser of its own (a separate look at the same page, not the replay's), measures that
element's box and answers a
`computer_use` `left_click` at its centre on the 0-1000 grid, as the model writes it. A question it has no
phrase for gets a reply that names no point, like a model that sees nothing fitting. `requests` keeps the
questions it was asked.
"""

from __future__ import annotations

import base64
import io
import json
import threading

from PIL import Image

from tests.pages.helpers import VIEWPORT, measure_along
from tests.support.screenspot_oracle import serve

GROUNDING_MARK = "you MUST left click on the corresponding UI element"


class DomGroundingOracle:
    def __init__(self, url: str, targets: dict[str, str | list[int]], viewport=VIEWPORT):
        self.url = url
        self.targets = targets
        self.viewport = viewport
        self.requests: list[str] = []
        self.problems: list[str] = []  # requests that were not the grounding question on a page screenshot
        self._lock = threading.Lock()

    def _box_centre(self, selector: str) -> list[int]:
        return measure_along(self.url, [("measure", selector)], self.viewport)[selector]

    def reply(self, body: dict) -> str:
        messages = body.get("messages", [])
        system = " ".join(str(m.get("content")) for m in messages if m.get("role") == "system")
        user = [m for m in messages if m.get("role") == "user"][-1]
        parts = user["content"] if isinstance(user["content"], list) else [{"type": "text", "text": user["content"]}]
        text = " ".join(p["text"] for p in parts if p.get("type") == "text").strip()
        urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
        with self._lock:
            self.requests.append(text)
            if GROUNDING_MARK not in system:
                self.problems.append(f"not the grounding question: {system[:80]!r}")
            if len(urls) != 1:
                self.problems.append(f"{len(urls)} images")
            else:
                with Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1]))) as img:
                    if img.size != tuple(self.viewport):
                        self.problems.append(f"a screenshot of {img.size}, not the viewport")
        for phrase, selector in self.targets.items():
            if phrase in text:  # a selector, or a fixed grid point (an answer pointing at nothing)
                point = selector if isinstance(selector, list) else self._box_centre(selector)
                call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": point}}
                return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        return "I cannot find that on the screen."


def start(oracle: DomGroundingOracle):
    """Serve the oracle; returns (the --engine spec, the server to shut down)."""
    httpd = serve(oracle)
    return f"openai:http://127.0.0.1:{httpd.server_address[1]}/v1", httpd
