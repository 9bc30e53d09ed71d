"""Take over and hand back: the person pauses a run between two steps, acts, and gives the run back.

One `TakeOver` is shared by the step loop (`agent.Agent` calls `between_steps` after each step), the
hotkey's thread (`toggle`), a banner's or the tray's button (`hand_back`) and the model (its `call_user`
action reaches `request` with its reason). A request never cuts a step short: the loop pauses once the
step under way has ended. While paused, `person` (a `PersonSteps`: the browser's capture of the person's
events, or the desktop's recorder) writes each thing the person does to the run's trace as a step with
`"by": "person"`, numbered after the agent's steps; the stop switch still ends the run at once. On hand
back the agent gets one observation saying, in words, what the person did (`what_the_person_did`), and
the next step's fresh screenshot, as every step has.

This module knows nothing of Qt, Playwright or pynput: the command gives it `show`, which tells the
person (a terminal line, a banner window, the tray) that the run is paused or going on again.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable
from typing import Protocol

from qvl_agent.act.guard import StopSwitch
from qvl_agent.dialog_text import json_text
from qvl_agent.step_words import person_step

POLL_S = 0.1  # how often a pause looks at the stop switch (and lets a browser's events in)
PAUSED, RESUMED = "paused", "resumed"


class PersonSteps(Protocol):
    """What records the person while a run is paused (the browser's or the desktop's recorder)."""

    def start(self, first_step: int) -> None:
        """Record from now on; the first step written is numbered `first_step`."""

    def pump(self, seconds: float) -> None:
        """Let the person's events in for up to `seconds` (a browser's arrive only while it is waited on)."""

    def stop(self) -> list[dict]:
        """Stop recording; the step records written to the trace, in order."""


class TakeOver:
    """The pause between steps. `show(state, reason)` is called with "paused" (and the reason, "" for the
    hotkey) and "resumed"; `hotkey` is the take-over hotkey as people read it ("Ctrl+Alt+T")."""

    def __init__(
        self,
        switch: StopSwitch,
        person: PersonSteps | None = None,
        *,
        show: Callable[[str, str], None] | None = None,
        hotkey: str = "",
        where: str = "the screen",
    ):
        self.switch = switch
        self.person = person
        self.show = show
        self.hotkey = hotkey
        self.where = where  # what the person acted on, for the words when nothing of it was recorded
        self.pauses = 0
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._back = threading.Event()
        self._paused = False
        self._reason = ""
        self._listener = None
        self.on_resume: Callable[[], None] | None = None  # after the person's steps are written

    def listen(self, combo: str) -> str:
        """Listen for the take-over hotkey (pynput syntax, "<ctrl>+<alt>+t"); "" or why it cannot work here."""
        from qvl_agent.act.guard import start_hotkeys

        try:
            self._listener = start_hotkeys({combo: self.toggle})
        except RuntimeError as exc:
            return str(exc)
        return ""

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
            listener.join(timeout=1.0)

    # --- asked from any thread ------------------------------------------------------------------------

    def request(self, reason: str = "") -> None:
        """Pause once the step under way ends (the hotkey, the tray, or the model's `call_user`)."""
        with self._lock:
            if self._paused:
                return
            self._reason = self._reason or reason
            self._wanted.set()

    def hand_back(self) -> None:
        """Give the run back to the agent (the hotkey again, the banner's button, the tray)."""
        with self._lock:
            if self._paused:
                self._back.set()
            else:  # asked for but not begun yet: the person changed their mind
                self._wanted.clear()
                self._reason = ""

    def mark_private(self, on: bool) -> None:
        """The person marks what they type from now on private (the banner's box), where the recorder of
        the person can keep it out of the trace (the desktop's; a browser finds password fields itself)."""
        mark = getattr(self.person, "mark_private", None)
        if mark is not None:
            mark(on)

    def keep_out(self, area, what: str = "banner") -> None:
        """A place of ours on the desktop (an `image.Region`) where the person's presses are no steps: the
        banner, the tray's icon, its menu; `what` names it, and a place told again under its name moves."""
        keep = getattr(self.person, "keep_out", None)
        if keep is not None:
            keep(area, what)

    def toggle(self) -> None:
        """The take-over hotkey: take over, or hand back when the run is paused."""
        with self._lock:
            paused = self._paused
        self.hand_back() if paused else self.request()

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._paused

    @property
    def wanted(self) -> bool:
        """A take-over is asked for or under way."""
        return self._wanted.is_set()

    # --- the loop's side ------------------------------------------------------------------------------

    def between_steps(self, next_step: int) -> tuple[list[dict], str] | None:
        """None when no take-over was asked for; else pause until handed back (EmergencyStop when the stop
        switch ends the run meanwhile) and return the person's step records and the words for the model."""
        if not self._wanted.is_set():
            return None
        with self._lock:
            self._paused, reason = True, self._reason
            self._back.clear()
        self.pauses += 1
        records: list[dict] = []
        started = shown = False
        try:
            if self.person is not None:
                self.person.start(next_step)
                started = True
            # Told only once the person is recorded: what they do as soon as they read it is a step too.
            self._show(PAUSED, reason)
            shown = True
            while not self._back.is_set():
                self.switch.check()
                if self.person is not None:
                    self.person.pump(POLL_S)
                else:
                    self._back.wait(POLL_S)
            self.switch.check()
        finally:
            if started:
                records = self.person.stop()
            if self.on_resume is not None:
                self.on_resume()
            with self._lock:
                self._paused, self._reason = False, ""
                self._wanted.clear()
            if shown:
                self._show(RESUMED, "")
        where = self.where if self.person is None else ""
        url_now = str(getattr(self.person, "url", "") or "")
        return records, what_the_person_did(records, reason, where, url_now)

    def _show(self, state: str, reason: str) -> None:
        if self.show is not None:
            try:
                self.show(state, reason)
            except Exception:  # a banner that failed must not take the run down: the terminal line stays
                pass


PAST = {"click": "clicked", "type": "typed", "press": "pressed", "choose": "chose", "double-click": "double-clicked",
        "triple-click": "triple-clicked", "right": "right-clicked", "middle": "middle-clicked"}  # fmt: skip


def what_the_person_did(records: list[dict], reason: str = "", where: str = "", url_now: str = "") -> str:
    """The observation on hand back: `The person took over and: clicked the "Sign in" button; typed into
    the "Password" field (a secret); went to "https://..."`, from the person's step records (their results'
    words, as the recorder wrote them); `url_now` is the page's address at hand back."""
    said: list[str] = []
    url = ""
    for record in records:
        for action, result in zip(record.get("actions") or [], record.get("results") or [], strict=False):
            at = str((result.get("detail") or {}).get("url") or "")
            if at and url and at != url:
                said.append(f"went to {json_text(at)}")
            url = at or url
            if not ("url" in (result.get("detail") or {}) or "locator" in (result.get("detail") or {})):
                said.append(person_step({"actions": [action], "results": [result]}) or "did something")
                continue  # a desktop step: a point on the model's grid, a key, typing (private never spelled)
            verb, _, rest = str(result.get("action") or action.get("action", "")).strip().partition(" ")
            if verb in ("right", "middle") and rest.startswith("click "):
                rest = rest[len("click ") :]
            words = f"{PAST.get(verb, verb)} {rest}".strip()
            typed = str(action.get("text", ""))
            if action.get("action") == "type" and typed.startswith("{{") and typed.endswith("}}"):
                words += " (a secret)"
            said.append(words)
    if url_now and url and url_now != url:
        said.append(f"went to {json_text(url_now)}")
    why = f" ({reason})" if reason else ""
    if said:
        done = "; ".join(said)
    elif where:
        done = f"acted on {where} (what they did was not recorded)"
    else:
        done = "did nothing that was recorded"
    return f"The person took over{why} and: {done}. They handed the run back to you."


class DesktopPerson:
    """The person's pointer and key events on the desktop, recorded by `act.desktop_recorder` (loaded at
    the first pause, so a run that is never taken over does not load it). `hotkeys` are the person's
    (pynput syntax): pressing them is no step. After each pause, `secrets` holds the run's secrets and what
    the person typed privately (the command hands them to the agent on resume: `masks_what_the_person_typed`),
    `problems` what could not be recorded."""

    def __init__(self, trace, secrets=None, hotkeys=None):
        from qvl_agent.secrets import Secrets

        self.trace, self.secrets = trace, secrets if secrets is not None else Secrets()
        self.hotkeys = tuple(hotkeys) if hotkeys is not None else None
        self.problems: list[str] = []
        self._recorder = None
        self._lock = threading.Lock()
        self._private = False
        self._kept_out: dict[str, object] = {}  # our places by name, which may be told before the recorder starts

    def start(self, first_step: int) -> None:
        from qvl_agent.act.desktop_recorder import DesktopRecorder

        recorder = DesktopRecorder(self.trace, self.secrets, first_step=first_step, hotkeys=self.hotkeys)
        with self._lock:
            if self._kept_out:
                recorder.keep_out(self._kept_out.values())
            if self._private:
                recorder.mark_private(True)
            self._recorder = recorder
        recorder.start()

    def mark_private(self, on: bool) -> None:
        with self._lock:
            self._private = on
            if self._recorder is not None:
                self._recorder.mark_private(on)

    def keep_out(self, area, what: str = "banner") -> None:
        with self._lock:
            self._kept_out[what] = area
            if self._recorder is not None:
                self._recorder.keep_out(self._kept_out.values())

    def pump(self, seconds: float) -> None:
        time.sleep(seconds)  # the recorder listens on threads of its own

    def stop(self) -> list[dict]:
        with self._lock:
            recorder, self._recorder = self._recorder, None
            self._private, self._kept_out = False, {}  # the next pause has a banner of its own, unticked
        if recorder is None:
            return []
        written = recorder.stop()
        self.secrets = recorder.secrets
        self.problems += recorder.problems
        return written


def desktop_person(trace, secrets=None, hotkeys=None) -> DesktopPerson | None:
    """The desktop's recorder of the person, or None where this build has none (the pause then records
    nothing, and the model is told the person acted on the desktop)."""
    if trace is None or importlib.util.find_spec("qvl_agent.act.desktop_recorder") is None:
        return None
    return DesktopPerson(trace, secrets, hotkeys)


def masks_what_the_person_typed(takeover: TakeOver, agent) -> None:
    """From each hand back on, the agent masks what the person typed privately (a password field, or marked
    private) as it masks the run's own secrets: in its trace, its events and the report."""

    def on_resume() -> None:
        secrets = getattr(takeover.person, "secrets", None)
        if secrets is not None:
            agent.secrets = type(secrets)({**agent.secrets.values, **secrets.values})

    takeover.on_resume = on_resume
