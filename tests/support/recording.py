"""An executor for tests: shows prepared screenshots and records every action it is asked to do.

`screens` is a list of screenshots shown in turn (the last one repeats) or a callable returning the next
one. `fail` maps an action kind to an error message: such actions raise `ActionError`, as a real
executor does when something cannot be carried out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qvl_agent import actions as A
from qvl_agent.act.base import ActionResult
from qvl_agent.errors import ActionError
from qvl_agent.image import Screenshot, to_pixels


@dataclass(frozen=True)
class Recorded:
    action: A.Action
    pixels: tuple[tuple[int, int], ...]
    shot_hash: str  # the screenshot the model looked at


class RecordingExecutor:
    name = "recording"

    def __init__(self, screens: Sequence[Screenshot] | Callable[[], Screenshot], fail: dict[str, str] | None = None):
        self._screens = screens
        self._shown = 0
        self.fail = dict(fail or {})
        self.recorded: list[Recorded] = []
        self.observed = 0
        self.settled = 0
        self.closed = False

    def observe(self) -> Screenshot:
        self.observed += 1
        if callable(self._screens):
            return self._screens()
        shot = self._screens[min(self._shown, len(self._screens) - 1)]
        self._shown += 1
        return shot

    def validate(self, action: A.Action) -> None:
        if action.kind in self.fail:
            raise ActionError(self.fail[action.kind])

    def execute(self, action: A.Action, shot: Screenshot) -> ActionResult:
        if action.kind in self.fail:
            raise ActionError(self.fail[action.kind])
        pixels = tuple(to_pixels(x, y, shot) for x, y in A.points(action))
        self.recorded.append(Recorded(action, pixels, shot.content_hash))
        return ActionResult(True, A.describe(action), {"pixels": [list(p) for p in pixels]})

    def wait_until_settled(self, timeout_s: float) -> None:
        self.settled += 1

    def close(self) -> None:
        self.closed = True

    @property
    def actions(self) -> list[A.Action]:
        return [r.action for r in self.recorded]
