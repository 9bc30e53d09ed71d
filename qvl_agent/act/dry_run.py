"""A dry run: observe the real screen, carry out nothing, remember what would have been done.

Wraps another executor for `observe` and `validate` only (the desktop's mss grab or the browser's page
screenshot; its own key and text checks), so the model sees the real screen and an action the real
executor would refuse is refused here too, while the pointer and the keyboard stay untouched. Each action
is mapped to pixels exactly as the real executor would, so a dry run shows where every click would land.
"""

from __future__ import annotations

from qvl_agent import actions as A
from qvl_agent.act.base import ActionResult, Executor
from qvl_agent.image import Screenshot, to_pixels


class DryRunExecutor:
    name = "dry-run"

    def __init__(self, inner: Executor):
        self.inner = inner
        self.done: list[tuple[A.Action, list[tuple[int, int]]]] = []

    def observe(self) -> Screenshot:
        return self.inner.observe()

    @property
    def reused_capture(self) -> bool:
        return getattr(self.inner, "reused_capture", False)

    def validate(self, action: A.Action) -> None:
        self.inner.validate(action)

    def execute(self, action: A.Action, shot: Screenshot) -> ActionResult:
        self.validate(action)  # ActionError, exactly as the real executor would raise it
        pixels = [to_pixels(x, y, shot) for x, y in A.points(action)]
        self.done.append((action, pixels))
        # The message goes back to the model: it says what happened, the pixels stay in the detail.
        return ActionResult(True, "not carried out (dry run)", {"pixels": [list(p) for p in pixels]})

    def wait_until_settled(self, timeout_s: float) -> None:
        """Nothing was done, so nothing can change."""

    def close(self) -> None:
        self.inner.close()
