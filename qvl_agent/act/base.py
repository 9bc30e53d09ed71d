"""The executor contract: what every way of carrying out actions (desktop, browser, dry run) provides.

An executor observes (returns the screenshot the model sees next) and executes one action at a time,
given the screenshot the model looked at when it chose the action, so model coordinates can be mapped
through exactly that capture. `execute` returns an `ActionResult`; an action that cannot be carried out
raises `ActionError` (its message goes back to the model). Executors never ask the person anything:
confirmation, confinement and the emergency stop belong to `act.guard`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from qvl_agent.actions import Action, HandleDialog
from qvl_agent.image import Screenshot


@dataclass(frozen=True)
class ActionResult:
    """What carrying out one action did. `detail` holds what a trace or a script export needs: pixel
    coordinates (`"pixels": [[x, y], ...]`), the browser locator, the keys pressed, ..."""

    ok: bool
    message: str = ""
    detail: dict = field(default_factory=dict)


@runtime_checkable
class Executor(Protocol):
    name: str

    def observe(self) -> Screenshot:
        """What the model sees next (desktop: an mss grab of the monitor/region; browser: the page)."""
        ...

    def execute(self, action: Action, shot: Screenshot) -> ActionResult:
        """Carry out one action; `shot` is the screenshot the model looked at when it chose it."""
        ...

    def validate(self, action: Action) -> None:
        """Raise ActionError when the action could not be carried out here (an unknown key, text this
        keyboard cannot type), without doing anything. The dry run calls it, so it refuses what the real
        executor would refuse."""
        ...

    def wait_until_settled(self, timeout_s: float) -> None:
        """Return once the screen stopped changing, or after `timeout_s`."""
        ...

    def close(self) -> None:
        """Release what the executor holds (held keys/buttons, a browser)."""
        ...


@dataclass(frozen=True)
class Dialog:
    """A dialog a web page opened: `kind` is Playwright's type (alert, confirm, prompt, beforeunload),
    `default` a prompt's default text; `during` the action that was in flight when it opened ("" when none
    was: the page's load or a timer)."""

    kind: str
    message: str
    default: str = ""
    url: str = ""
    during: str = ""

    def describe(self) -> str:
        """One line for a person or the model, e.g. `a confirm dialog: "Delete the note?"`."""
        return f"{'an' if self.kind[:1] in 'aeiou' else 'a'} {self.kind} dialog: {self.message!r}"


DialogAnswer = Callable[[Dialog], HandleDialog | None]  # None: left open for the person to answer


@runtime_checkable
class DialogSource(Protocol):
    """An executor whose page can open dialogs (the browser). The page is blocked until a dialog is
    answered, so the answer is asked for on the spot, while the action that opened it is still in flight."""

    def answer_dialogs_with(self, answer: DialogAnswer | None) -> list[dict]:
        """Answer each dialog from now on with `answer` (None: dismiss it); returns the dialogs that were
        dismissed before, as they were recorded (the page's first load opens them before the run starts)."""
        ...
