"""Recording a person's work in a headed Chromium as the steps of a browser run (`qvl-agent record`, and
the person's part of a run they took over, `takeover.py`).

`PersonCapture` is the browser executor turned around: the same browser, context, tab bookkeeping and end
state (`BrowserExecutor`), but the actions come from the person; it switches on and off on a running
executor. `BrowserRecorder` is a headed executor with the capture on from the start. A script installed in every frame
before the page's own (`playwright.recording.capture_script`) listens in the capture phase, for trusted
events only, and hands each one to the recorder through a Playwright binding:

  - `pointerdown`: the element a click will act on (the same choice as `locate`, made in the page) and its
    state, read before the click changes anything; the page's text, for the end state's "what appeared";
  - `beforeinput` (the first of a run of typing into one field): the field and its value before it;
  - `keydown`: Enter, Tab, Escape, arrows and other named keys, and chords, with the focused element;
  - `change` of a `<select>`: its state before and after the choice.

Each becomes one step in exactly the shape the executor records (`left_click`, `type`, `key`, with a
`detail` holding the locator, the element, its state before and after, the URL, the pixel, the tab) and
`"by": "person"`, so the exporter (`steps_from_trace`, `export_run`) compiles it as it compiles a
model's run: a click and the typing that follows become one `fill` of the value the field ended with, a
checkbox click `check`, a choice `select_option`. A step is written when the next one starts (or the
recording stops), because its "after" state is what the element shows then.

The element is resolved to its locator (`locate.resolve_handle`) while the person still holds the mouse
button. When Python is slower than the person's finger, the page's `click` is held back until the step is
resolved and then dispatched again (an untrusted click on the same element, with the same coordinates):
a click that deletes its own row still finds the row.

A password field's value never reaches the trace: the first time a step shows one (typing into it, or
any state read from it), the value becomes a secret (`PASSWORD`, or a name from the field's label),
masked (`Secrets.mask`) in every step, in the end state and in the URL; the export reads it from
`$QVL_SECRET_NAME` (`typed`).

A dialog the page opens (alert, confirm, prompt, beforeunload) is the person's to answer: it stays open in
the window (`act.person_dialogs`), and what they chose, as the browser reports it, becomes a
`handle_dialog` step of theirs in the shape the agent writes for the model's answer, carried also by the
step whose click opened it (`"dialogs"`, what the export expects before that step). A prompt's text is a
secret when it is one already known, or when the prompt asks for one ("Your PIN?").

The page can call the binding itself, and reads what the capture script sends: every payload is checked
for the recording's signature (`playwright.signing`), its order and its shape before anything is read
from it, and the element the step is about is taken from the page's own event
(by id, from the capture script's table), never from a description the page could forge.
"""

from __future__ import annotations

import itertools
import re
import secrets as token
import time
from dataclasses import dataclass, field

from qvl_agent import actions as A
from qvl_agent.act.base import Dialog
from qvl_agent.act.browser import ACTION_TIMEOUT_MS, BrowserExecutor
from qvl_agent.act.person_dialogs import PersonDialogs, prompt_secret
from qvl_agent.dialog_text import json_text
from qvl_agent.errors import QvlError
from qvl_agent.image import GRID, Screenshot, load_image_bytes
from qvl_agent.playwright.locate import POINT_ONLY, Located, element_state, point_on, resolve_handle
from qvl_agent.playwright.recording import BINDING, Reports, capture_script, target_tag
from qvl_agent.secrets import SECRET_NAME, Secrets

# --- the recorder --------------------------------------------------------------------------------------


@dataclass
class _Step:
    """A person's step being recorded: written once the next one starts (its "after" is read then)."""

    n: int
    kind: str
    detail: dict
    handle: object | None = None
    located: Located | None = None
    screenshot: str = ""
    screen: dict = field(default_factory=dict)
    no_screenshot: str = ""  # why the step has no picture, for the trace and the report


# Why a step has no picture when the recorder heard it only after later events had changed the page.
MOVED_ON = "the recorder got to this step after the page had moved on"
SNAPSHOT_AFTER_S = 1.0  # a page this long without a person's event is read for its end state
SETTLE_S = 3.0  # the longest a stop waits for the page to settle
POINTER_KINDS = {0: "left_click", 1: "middle_click", 2: "right_click"}
CLICK_COUNTS = {2: "double_click", 3: "triple_click"}


def secret_name(located: Located | None, taken: dict[str, str], value: str) -> str:
    """A secret's name for a password field: from its label or name (`PASSWORD`, `PIN`), with _2, _3... when
    that name already holds another value."""
    locator = (located.locator if located else {}) or {}
    words = locator.get("name") or locator.get("text") or ""
    base = re.sub(r"[^A-Za-z0-9]+", "_", str(words)).strip("_").upper()[:40]
    if not base or not SECRET_NAME.fullmatch(base) or base[0].isdigit():
        base = "PASSWORD"
    name, n = base, 1
    while name in taken and taken[name] != value:
        n += 1
        name = f"{base}_{n}"
    return name


class PersonCapture:
    """The capture of a person's work in the browser of `executor` (a `BrowserExecutor`), written into
    `trace` (a `trace.TraceWriter`) as steps `"by": "person"`. It can be switched on and off on a running
    executor: `start(first_step)` records from then on (the capture script and its binding are installed in
    the browser the first time), `stop()` writes the last step and returns the step records written since
    `start`; between the two, events are only received while Playwright is waited on (`pump`, `wait`). While
    off, every event is dropped, also the executor's own clicks (Playwright's input is trusted too).
    `typed` is what each typing step typed, as `export_trace` takes it; `secrets` the values found in
    password fields (never written), on top of the run's own declared secrets when it is given them."""

    def __init__(self, executor: BrowserExecutor, trace, secrets: Secrets | None = None):
        self.ex = executor
        self.trace = trace
        self.secrets = secrets or Secrets({})
        self.typed: dict[tuple[int, int], list] = {}
        self.steps = 0
        self.records: list[dict] = []  # written since the last `start`
        self.problems: list[str] = []  # events that could not be recorded, for the person at the end
        self._nonce = token.token_hex(32)
        self._reports = Reports(self._nonce)
        self._pending: _Step | None = None
        self._tickets = itertools.count()
        self._serving = 0
        self._issued = 0  # the last ticket handed out
        self._skipped: set[int] = set()
        self._stopping = True  # off until `start`
        self._installed = False
        self._url_now = executor.page.url
        self._last_event = time.monotonic()
        self._seen = 0  # the step count when the end state was last read
        self._last_final: dict | None = None
        self.forget: tuple[str, ...] = ()  # hotkeys (Playwright's "Control+Alt+t") that are no step of the person
        self._person_dialogs: PersonDialogs | None = None  # the dialogs the person answers in the window
        self._after_pending: list[dict] = []  # dialog steps, written after the step that opened them
        self._agent_answer = None  # the executor's dialog answer while the person is not recording

    @property
    def url(self) -> str:
        """The address the current tab is on (as its last navigation said)."""
        return self._url_now

    def _install(self) -> None:
        if self.ex._trace_path is not None:  # its page snapshots would hold what the person types, passwords too
            try:
                self.ex.context.tracing.stop()
            except self.ex._error_type:
                pass
            self.ex._trace_path = None
            self.problems.append("the run keeps no Playwright trace (trace.zip): the person took it over")
        self._person_dialogs = PersonDialogs(self.ex.context, self.ex._error_type, self._dialog_answered)
        script = capture_script(self._nonce)
        self.ex.context.expose_binding(BINDING, self._on_event)
        self.ex.context.add_init_script(script)
        for page in self.ex.context.pages:
            self.watch(page)
            for frame in page.frames:  # pages loaded before the script was there
                try:
                    frame.evaluate(script)
                except self.ex._error_type:
                    pass
        self.ex.context.on("page", self.watch)
        self._installed = True

    def watch(self, page) -> None:
        page.on("framenavigated", lambda frame: self._navigated(page, frame))
        if self._person_dialogs is not None:
            self._person_dialogs.watch(page)

    def start(self, first_step: int = 1) -> None:
        """Record from now on, the first step numbered `first_step`."""
        if not self._installed:
            self._install()
        self.steps = first_step - 1
        self._seen = self.steps
        self.records = []
        self._pending = None
        self._url_now = self.ex.page.url
        # The page's dialogs are the person's from now on: left open in the window, their answer recorded.
        self._agent_answer = self.ex.dialog_answer
        self._person_dialogs.resume()
        for early in self.ex.answer_dialogs_with(self._person_dialogs.leave_open):
            seen = Dialog(early["type"], early["message"]).describe()
            self.problems.append(f"the page opened {seen} before the recording began; it was dismissed")
        self._stopping = False

    def pump(self, seconds: float) -> None:
        """Wait `seconds` on the current page, so that the person's events come in meanwhile."""
        live = [p for p in self.ex.context.pages if not p.is_closed()]
        try:
            (self.ex.page if self.ex.page in live else live[-1]).wait_for_timeout(seconds * 1000)
        except (IndexError, self.ex._error_type):
            time.sleep(seconds)  # no page (or it closed under the wait): the executor says so on its next step

    def stop(self) -> list[dict]:
        """Write the last step and stop recording; the step records written since `start`. A page the
        person's last click is loading is waited for (up to `SETTLE_S`): what comes next sees it loaded."""
        for keys in self.forget:
            self.forget_key(keys)
        self._stopping = True
        for left in self._person_dialogs.dismiss_open():  # its page can be read only once it is closed
            seen = Dialog(left["type"], left["message"]).describe()
            self.problems.append(f"{seen} was still open when the recording stopped: it was dismissed, and is not part "
                                 "of the recording")  # fmt: skip
        self.problems.extend(self._person_dialogs.unread)
        self._person_dialogs.unread.clear()
        self._finish()
        self.ex.answer_dialogs_with(self._agent_answer)  # the run's own answer again (the model's, or none)
        self.ex.wait_until_settled(SETTLE_S)
        return list(self.records)

    def _navigated(self, page, frame) -> None:
        if frame is page.main_frame and page is self.ex.page:
            self._url_now = frame.url

    def wait(self, should_stop) -> str:
        """Record until `should_stop()` is true or the person closed the browser; says which. While the
        page is quiet after a step, its end state is read, so that a window closed by the person still
        leaves the checks of what it showed last."""
        while not should_stop():
            if self.ex._dead or not self.ex.browser.is_connected():
                return "the browser closed"
            live = [p for p in self.ex.context.pages if not p.is_closed()]
            if not live:
                return "the window was closed"
            try:
                live[-1].wait_for_timeout(100)
            except self.ex._error_type:
                continue  # that page closed under the wait: look again
            quiet = time.monotonic() - self._last_event > SNAPSHOT_AFTER_S
            if self._seen != self.steps and quiet and not self._person_dialogs.open:  # an open dialog blocks it
                self._seen = self.steps
                try:
                    self._last_final = self.ex.final_state()
                except (QvlError, self.ex._error_type):
                    pass  # the page is going: the earlier snapshot stands
        return "stopped"

    def forget_key(self, keys: str) -> None:
        """Leave out the last step when it is the press of `keys` (Playwright's "Control+Alt+Escape"): the
        hotkey that ended the recording reached the page too, and is no part of the task."""
        step = self._pending
        if step is not None and step.kind == "key" and set(step.detail["keys"].split("+")) == set(keys.split("+")):
            self._pending = None
            self._drop(step)

    def _drop(self, step: _Step) -> None:
        """A step that turned out to be none: its picture goes (its number stays unused)."""
        if step.screenshot:
            (self.trace.dir / step.screenshot).unlink(missing_ok=True)

    def end_state(self) -> dict:
        """The page's end state (masked): read from the page when it is still open, else what it showed
        when it was last quiet (or only the URL it was on)."""
        try:
            final = self.ex.final_state()
        except (QvlError, self.ex._error_type):
            final = self._last_final or {"url": self._url_now, "fields": [], "new_text": [], "gone": []}
        return self.secrets.mask(final)

    # --- events -----------------------------------------------------------------------------------------

    def _on_event(self, source, payload) -> None:
        """The binding: one event at a time, in the order the page sent them (each call runs in its own
        greenlet, and resolving a locator waits on the page, so a later event could overtake)."""
        event = self._reports.open(payload)
        if event is None or self._stopping:
            return  # not the capture script's (a page calling the binding itself): dropped before it waits
        ticket = self._issued = next(self._tickets)
        my_turn = False
        try:
            while self._serving < ticket and not self._stopping:
                source["page"].wait_for_timeout(10)
            my_turn = True
            self._last_event = time.monotonic()
            if not self._stopping:
                self._record(source, event)
        except Exception as exc:  # a page that navigated or closed mid-event: that event is lost, not the run
            if len(self.problems) < 20:
                self.problems.append(f"an event could not be recorded ({str(exc).splitlines()[0][:200]})")
        finally:
            if my_turn:
                self._serving = ticket + 1
            else:
                self._skipped.add(ticket)
            while self._serving in self._skipped:
                self._skipped.discard(self._serving)
                self._serving += 1

    def _record(self, source, event: dict) -> None:
        page, frame = source["page"], source["frame"]
        pending = self._pending
        if (
            event["kind"] == "pointer"
            and event["count"] in CLICK_COUNTS
            and pending is not None
            and pending.kind in ("left_click", "double_click")
            and pending.detail.get("frame_point") == [round(event["x"]), round(event["y"])]
        ):
            pending.kind = CLICK_COUNTS[event["count"]]  # the second press of a double click
            return
        handle = self._handle(frame, event["id"])
        # Read in the page as this event happened, not as the page is by now: typing that ends leaves its
        # field as it was then (the page may have navigated since); typing into the element just clicked
        # finds it as the click left it (some of the typing may be in it by now).
        after = None
        if pending is not None and pending.kind == "type":
            after = event["typed"]
        elif event["kind"] == "typing" and self._same(pending, handle):
            after = event["state"]
        before_step = pending
        self._finish(after)
        if event["kind"] == "pointer" and event["button"] not in POINTER_KINDS:
            return
        self.ex.page = page
        main = frame is page.main_frame
        # An (i)frame, a canvas or the bare page stays a point, as `locate` keeps it for the model's clicks.
        named = main and (event["state"] or {}).get("tag") not in POINT_ONLY
        located = self._resolve(page, handle) if named else None
        if located is None and event.get("own") and before_step is not None and before_step.located is not None:
            # The element of the step before (a key in the field just typed into, typing into the field
            # just clicked), whose page went on before this event could be resolved (Enter that submits).
            located, handle = before_step.located, before_step.handle
        detail: dict = {"url": event["url"] if main else page.url}
        if not main:
            detail["frame"] = event["url"]  # the document inside the frame, for the person reading the report
        if self.ex._tab():
            detail["tab"] = self.ex._tab()
        if located is not None:
            detail["locator"], detail["element"] = located.locator, located.element
        kind = event["kind"]
        if kind == "pointer":
            kind = POINTER_KINDS[event["button"]]
            x, y = event["x"], event["y"]
            px, py = (x, y) if main else self._in_page(frame, x, y)
            detail["pixels"] = [[round(px), round(py)]]
            detail["frame_point"] = [round(x), round(y)]
            if located is None:
                detail["locator"] = {"kind": "point", "x": round(px), "y": round(py)}
                detail.setdefault("element", {})
            else:
                detail.update(point_on(handle, x, y))
            detail["before"] = event["state"]
            self.ex._text_before_last_click = event["text"]
        elif kind == "typing":
            kind = "type"
            detail["before"] = event["state"]
        elif kind == "key":
            detail["keys"] = event["keys"]
            detail["before"] = event["state"]
        elif kind == "select":
            if located is None:
                self.problems.append("a choice in a list that has no locator was not recorded")
                return
            kind = "left_click"  # the person's choice, compiled as a click that changed the select
            box = located.element.get("box") or [0, 0, 0, 0]
            detail["pixels"] = [[round(box[0] + box[2] / 2), round(box[1] + box[3] / 2)]]
            detail["before"], detail["after"] = event["before"], event["state"]
            detail["chosen"] = True
        self.steps += 1
        step = _Step(self.steps, kind, detail, handle, located)
        if self._issued == self._serving:  # no event waits: a picture now still shows the page before it
            self._shoot(page, step)
        else:  # a picture now would show the page after later events, as this step never saw it
            step.no_screenshot = MOVED_ON
        self._pending = step

    def _handle(self, frame, target: int):
        """The event's element, from the capture script's table; None when its document is gone."""
        if not target:
            return None
        try:
            found = frame.evaluate_handle(f"(id) => window['__qvlTarget_{target_tag(self._nonce)}'](id)", target)
        except self.ex._error_type:
            return None  # the page navigated while this event waited its turn
        return found.as_element()

    def _same(self, step: _Step | None, handle) -> bool:
        if step is None or step.handle is None or handle is None:
            return False
        try:
            return bool(step.handle.evaluate("(a, b) => a === b", handle))
        except self.ex._error_type:
            return False

    def _resolve(self, page, handle) -> Located | None:
        if handle is None:
            return None
        try:
            located = resolve_handle(page, handle)
        except self.ex._error_type:
            return None  # it left the page (or the page left) before it could be named
        if located is not None:
            self.ex._touched.append((page, located))
        return located

    def _in_page(self, frame, x: float, y: float) -> tuple[float, float]:
        """A point in a frame as a CSS pixel of the page's viewport."""
        try:
            box = frame.frame_element().bounding_box() or {"x": 0, "y": 0}
        except self.ex._error_type:
            box = {"x": 0, "y": 0}
        return box["x"] + x, box["y"] + y

    def _shoot(self, page, step: _Step) -> None:
        try:
            png = self.ex.png(page, timeout=ACTION_TIMEOUT_MS)
        except self.ex._error_type as exc:  # the step goes without a picture, and the person is told why
            why = str(exc).splitlines()[0][:200]
            step.no_screenshot = f"the browser did not take it: {why}"
            if len(self.problems) < 20:
                self.problems.append(f"step {step.n} has no picture ({why})")
            return
        shot = load_image_bytes(png, name="page screenshot")
        view = Screenshot(shot.data, shot.width, shot.height, shot.layout, source=f"browser:{page.url}")
        step.screenshot = self.trace.screenshot(step.n, view)
        step.screen = {"left": 0, "top": 0, "width": view.width, "height": view.height, "scale": 1.0}

    # --- writing a step ---------------------------------------------------------------------------------

    def _finish(self, after: dict | None = None) -> None:
        """Write the pending step, its "after" state read now (or `after`, when that was read earlier), and
        the dialogs it opened."""
        self._write_pending(after)
        records, self._after_pending = self._after_pending, []
        for record in records:
            self._write(record)

    def _write(self, record: dict) -> None:
        record = self.secrets.mask(record)
        self.records.append(record)
        self.trace.step(record)

    def _write_pending(self, after: dict | None) -> None:
        step, self._pending = self._pending, None
        if step is None:
            return
        detail = step.detail
        detail.pop("frame_point", None)
        if not detail.pop("chosen", False):
            detail["after"] = after if after is not None else element_state(step.handle)
        action: dict = {"action": step.kind}
        if step.kind == "type":
            self._typing(step)
            if not detail["text"] and (detail["after"] or {}).get("value") == (detail["before"] or {}).get("value"):
                self._drop(step)  # typing that changed nothing (a key the field ignored): no step
                return
            action["text"] = detail["text"]
        elif step.kind == "key":
            action["keys"] = detail["keys"].split("+")
        for state in (detail.get("before"), detail.get("after")):
            self._keep_secret(state, step.located)
        if detail.get("pixels") and step.screen:
            px, py = detail["pixels"][0]
            width, height = step.screen["width"], step.screen["height"]
            action["coordinate"] = [_grid(px, width), _grid(py, height)]
        result = {"action": describe(step), "ok": True, "message": "done by the person", "detail": detail}
        if detail.get("pixels"):
            result["pixels"] = detail["pixels"]
        record = {"step": step.n, "by": "person", "reply": "", "actions": [action], "results": [result]}
        if step.screenshot:
            record.update(screenshot=step.screenshot, screen=step.screen)
        elif step.no_screenshot:
            record["no_screenshot"] = step.no_screenshot
        self._write(record)

    def _dialog_answered(self, page, answer: dict) -> None:
        """A dialog the person answered in the window (`PersonDialogs`): a `handle_dialog` step of theirs,
        written after the step pending on its page (the click that opened it), which carries it too."""
        self._last_event = time.monotonic()
        pending = self._pending if page is self.ex.page else None
        name = self._prompt_secret(answer)
        if name:
            answer["typed"] = [["secret", name]]  # the export reads $QVL_SECRET_NAME there
        if pending is not None:
            answer["during"] = describe(pending)
            keep = ("type", "message", "accept", "text", "typed")
            pending.detail.setdefault("dialogs", []).append({k: v for k, v in answer.items() if k in keep})
        choice = A.HandleDialog(answer["accept"], answer.get("text"))
        how = "accepted" if answer["accept"] else "dismissed"
        message = f"{Dialog(answer['type'], answer['message']).describe()}: {how} by the person"
        seen = {k: answer[k] for k in ("type", "message", "default", "url")}
        self.steps += 1
        result = {"action": A.describe(choice), "ok": True, "message": message, "detail": {"dialog": answer}}
        record = {"step": self.steps, "by": "person", "reply": "", "dialog": seen}
        record.update(actions=[A.to_arguments(choice)], results=[result])
        if pending is None:
            self._write(record)
            return
        if pending.screenshot:  # the page behind the dialog, as the step that opened it saw it
            record.update(screenshot=pending.screenshot, screen=pending.screen)
        self._after_pending.append(record)

    def _prompt_secret(self, answer: dict) -> str:
        """The secret a prompt's text is: one already known by its value, or a new one when the prompt asks
        for one (`prompt_secret`); "" for plain text."""
        text = answer.get("text") or ""
        known = next((name for name, value in self.secrets.values.items() if value == text), "") if text else ""
        base = "" if known or not text else prompt_secret(answer["message"])
        if not base:
            return known
        name, n = base, 1
        while name in self.secrets.values:
            n += 1
            name = f"{base}_{n}"
        self.secrets = Secrets({**self.secrets.values, name: text})
        return name

    def _keep_secret(self, state: dict | None, located: Located | None) -> str:
        """A password field's value is a secret wherever it shows: its name (registered on first sight)."""
        value = str((state or {}).get("value") or "")
        if not state or state.get("type") != "password" or not value:
            return ""
        known = next((name for name, v in self.secrets.values.items() if v == value), "")
        if known:
            return known
        name = secret_name(located, dict(self.secrets.values), value)
        self.secrets = Secrets({**self.secrets.values, name: value})
        return name

    def _typing(self, step: _Step) -> None:
        """What a run of typing typed: the value it left, past what was there before; in a password field a
        secret, typed from its placeholder."""
        detail = step.detail
        before, after = detail.get("before") or {}, detail.get("after") or {}
        old, new = str(before.get("value") or ""), str(after.get("value") or "")
        text = new[len(old) :] if new.startswith(old) else new
        if before.get("type") == "password" and new:
            name = self._keep_secret(after, step.located)
            self.typed[step.n, 0] = [["secret", name]] if text == new else [["text", old], ["secret", name]]
            text = "{{" + name + "}}"
        detail["text"] = text


class BrowserRecorder(BrowserExecutor):
    """A headed Chromium on `url` that records what the person does into `trace` (a `trace.TraceWriter`),
    through a `PersonCapture` switched on from the start.

    `wait(should_stop)` returns when `should_stop()` says so or the person closed the browser; `stop()` writes
    the last step and returns the page's end state (masked) for `browser.json`. `typed` is what each typing
    step typed, as `export_trace` takes it; `secrets` the values found in password fields (never written)."""

    name = "recorder"

    def __init__(self, url: str, trace, *, browser=None, configured_browser: str = "", viewport=(1280, 800)):
        self.trace = trace
        super().__init__(url, browser=browser, configured_browser=configured_browser, headless=False, viewport=viewport)
        try:
            self.capture = PersonCapture(self, trace)
            self.capture.start(1)
        except BaseException:
            self.close()
            raise

    steps = property(lambda self: self.capture.steps)
    typed = property(lambda self: self.capture.typed)
    secrets = property(lambda self: self.capture.secrets)
    problems = property(lambda self: self.capture.problems)

    def wait(self, should_stop) -> str:
        """Record until `should_stop()` is true or the person closed the browser; says which."""
        return self.capture.wait(should_stop)

    def forget_key(self, keys: str) -> None:
        self.capture.forget_key(keys)

    def stop(self) -> dict:
        """Write the last step and return the end state (see `PersonCapture.end_state`)."""
        self.capture.stop()
        return self.capture.end_state()


def _grid(pixel: float, size: int) -> int:
    """A CSS pixel as the 0-1000 model coordinate of its centre (what the model would have written)."""
    return max(0, min(GRID, round((pixel + 0.5) * GRID / max(size, 1))))


def describe(step: _Step) -> str:
    """The step in words, for the report: `click the "Sign in" button`, `type into "Email"`, `press Enter`."""
    locator = (step.located.locator if step.located else {}) or {}
    inner = locator.get("inner") or locator
    what = inner.get("name") or inner.get("text") or inner.get("value") or ""
    role = inner.get("role") or (step.located.element.get("tag", "") if step.located else "")
    # The page's words in JSON quotes (`json_text`): a name with a quote in it cannot end them early and
    # go on as words of ours, in the report or in what the model is told the person did.
    target = f"the {json_text(str(what))} {role or 'element'}" if what else (f"the {role}" if role else "the page")
    if step.detail.get("frame"):
        target = f"the page inside a frame ({json_text(str(step.detail['frame'])[:80])})"
    if locator.get("kind") == "within":
        target += f" in the item that says {json_text(str(locator.get('has_text', '')))}"
    if step.kind == "type":
        return f"type into {target}"
    if step.kind == "key":
        return f"press {step.detail.get('keys', '')} on {target}"
    before, after = step.detail.get("before") or {}, step.detail.get("after") or {}
    if before.get("tag") == "select" and after.get("label") is not None and after != before:
        return f"choose {json_text(str(after['label']))} in {target}"
    verb = {"left_click": "click", "double_click": "double-click", "triple_click": "triple-click"}
    return f"{verb.get(step.kind, step.kind.replace('_', ' '))} {target}"
