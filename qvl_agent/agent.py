"""The step loop: capture -> engine -> parse -> guard -> execute -> wait until the screen settles -> next.

The model gets Qwen3-VL's computer-use tool schema in the system prompt (`prompts/<prompt_name>.txt`,
exactly as Qwen's cookbook renders it), the task with the first screenshot, and after each step a short
observation with the next screenshot. Observations say what happened ("left_click at (500, 310):
clicked", "type 'hi': typed 2 characters"): coordinates in them are the model's own 0-1000 grid, never
screen pixels, so the history speaks one coordinate system.

Context layout (a design choice, argued): each step is one chat turn, the screenshot and the observation
as the user, the model's own tool call as the assistant, as in the cookbook's multi-turn use. The
session is append-only, so an engine that keeps the KV cache prefills only the new screenshot and text
each step. Once `max_images` screenshots are in context the session is rebuilt once: every turn keeps
its text and the model's reply (its actions, verbatim), only the last `keep_images` screenshots stay,
and each turn that lost its screenshot says so (`prompts/<prompt_name>_omitted.txt`) instead of
claiming "this is the screen now". The recompute then happens every few steps instead of every step.
OSWorld's layout for Qwen3-VL (the instruction restated, a "previous actions" list, the last few
screenshots) rebuilds the whole prompt at every step because the list grows in front of the
screenshots: the same information, but no KV reuse, so every step would pay a full prefill of several
thousand tokens. The rebuilt turns here carry that information too: the task stays the first turn and
the model's actions stay in order, each with what it did.

Parse and action errors go back to the model as the next observation (at most `max_retries` in a row);
`terminate` and `answer` end the run; the emergency stop, `max_steps` and the per-step timeout end it too.
A page's dialog (browser runs only) blocks the page while the action that opened it is still running,
so the executor asks for the answer on the spot (`DialogSource`): the agent takes one model turn with the
dialog as the observation (the latest screenshot and `prompts/<prompt>_dialog.txt`), and that turn is a
step of its own in the trace. Its answer is a `handle_dialog` action; any other reply, the step limit,
the stop switch or the per-step timeout dismiss the dialog (Playwright's own default), said in the trace;
a stop or a timeout then ends the run once the action returns.

Capture and engine errors end the run with status "error"; Ctrl+C ends it as "interrupted", with its
trace closed like any other run's. A dry run (the dry-run executor) says so in its result, with the actions
that would have run; one the model ended as done has status "dry_run", never "success": nothing was done.
This module imports no torch, Qt, pyautogui or Playwright.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from qvl_agent import actions as A
from qvl_agent import prompts
from qvl_agent.act.base import ActionResult, Dialog, DialogSource, Executor
from qvl_agent.act.guard import Guard, Pixels, describe_pixels
from qvl_agent.dialog_text import dialog_fields as _fields
from qvl_agent.dialog_text import dialog_line as _dialog_line
from qvl_agent.engine.base import Engine, GenerationOptions, Session
from qvl_agent.errors import ActionError, EmergencyStop, GenerationCancelled, ParseError, QvlError
from qvl_agent.image import GRID, Screenshot
from qvl_agent.parse import parse_actions
from qvl_agent.secrets import Secrets
from qvl_agent.takeover import TakeOver
from qvl_agent.trace import TraceWriter

LONE_SURROGATE = re.compile("[\ud800-\udfff]")

STATUSES = ("success", "failure", "stopped", "limit", "error", "interrupted", "dry_run")
# A dry run the model ended as done: it only showed its actions, so it is not a "success".
DRY_RUN = "dry_run"
# How a run that never reached its first step ended (written by the commands, not by the loop).
FAILED_TO_START = "failed to start"
DRY_RUN_NOTE = "dry run, nothing was clicked or typed"


@dataclass(frozen=True)
class RunResult:
    status: str  # success | failure | stopped | limit | error | interrupted | dry_run
    answer: str = ""
    steps: int = 0
    message: str = ""
    dry_run: bool = False
    would_do: tuple[str, ...] = ()  # a dry run's actions that would have run, with their pixels

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def headline(self) -> str:
        """`status: message`, marked when nothing was done, so a dry run never reads as a done task."""
        if self.status == DRY_RUN:
            return f"dry run finished (nothing was clicked or typed): {self.message}"
        status = f"{self.status} ({DRY_RUN_NOTE})" if self.dry_run else self.status
        return f"{status}: {self.message}"

    def would_do_text(self) -> str:
        """The actions a dry run would have run, one numbered line each ("" for a real run)."""
        if not self.dry_run:
            return ""
        if not self.would_do:
            return "Would have run: no action."
        lines = [f"  {i}. {what}" for i, what in enumerate(self.would_do, start=1)]
        return "\n".join([f"Would have run ({len(self.would_do)} action{'s' * (len(self.would_do) != 1)}):", *lines])


@dataclass(frozen=True)
class AgentEvent:
    """Something the person may want to see. kinds: "step" (a new screenshot is with the model),
    "reply" (the model's whole reply), "action" (about to run; `pixels` says where), "result",
    "error" (fed back to the model), "dialog" (a page's dialog and its answer, in `message`),
    "done" (`message` holds the RunResult status)."""

    kind: str
    step: int
    message: str = ""
    action: A.Action | None = None
    pixels: tuple[tuple[int, int], ...] = ()
    shot: Screenshot | None = field(default=None, repr=False)


class _StepTimeout(Exception):
    pass


@dataclass(frozen=True)
class Observation:
    """One user turn of the run: `text` goes with its screenshot; `without_image` replaces it once a
    rebuild dropped that screenshot."""

    text: str
    without_image: str


class Agent:
    def __init__(
        self,
        engine: Engine,
        executor: Executor,
        guard: Guard,
        trace: TraceWriter | None = None,
        max_steps: int = 30,
        step_timeout_s: float = 120.0,
        prompt_name: str = "computer_use",
        confirm: Callable[[A.Action, Pixels, Screenshot], bool] | None = None,
        on_event: Callable[[AgentEvent], None] | None = None,
        max_retries: int = 3,
        max_images: int = 4,
        keep_images: int = 2,
        settle_timeout_s: float = 2.0,
        options: GenerationOptions | None = None,
        secrets: Secrets | None = None,
        takeover: TakeOver | None = None,
    ):
        self.engine = engine
        self.executor = executor
        self.guard = guard
        if confirm is not None:
            guard.confirm = confirm
        self.trace = trace
        self.max_steps = max_steps
        self.step_timeout_s = step_timeout_s
        self.prompt_name = prompt_name
        self.on_event = on_event
        self.max_retries = max_retries
        self.max_images = max(1, max_images)
        self.keep_images = max(1, min(keep_images, self.max_images))
        self.settle_timeout_s = settle_timeout_s
        self.options = options or GenerationOptions(max_new_tokens=256)
        # Typed by the executor, never seen by the model, the trace or the events (`secrets.py`).
        self.secrets = secrets or Secrets()
        self.takeover = takeover  # the person may pause the run between steps (`takeover.py`)
        # (step, action index) -> what each `type` typed, as the model wrote it: a secret where it typed a
        # declared placeholder, its own words elsewhere. Kept in memory for the export, never written: the
        # trace masks every secret's value wherever it shows, which a word equal to it would be.
        self.typed: dict[tuple[int, int], list] = {}
        self.session: Session | None = None
        self.rebuilds = 0
        self._without_images: list[str] = []  # per turn of the run: its text once its screenshot is gone
        self._would_do: list[str] = []  # a dry run's actions, as the person would read them
        self._steps = 0  # steps taken so far, a dialog's turn included
        self._last_shot: tuple[Screenshot, str] | None = None  # the latest screenshot and its trace file
        self._deferred: BaseException | None = None  # a stop or timeout met while answering a dialog
        self._dialog_records: list[dict] = []  # dialog steps, written after the step they interrupted
        self._record: dict | None = None  # the step under way
        self._typed_in_dialogs: list = []  # what prompts got during the action in flight (`Secrets.segments`)

    # --- prompts and context --------------------------------------------------------------------------

    def _prompt(self, suffix: str, **values) -> str:
        return prompts.load(f"{self.prompt_name}{suffix}").render(**values)

    def _observation(self, suffix: str, said: str, **values) -> Observation:
        """The turn `prompts/<prompt>_<suffix>.txt` and its text without a screenshot (what was `said`)."""
        return Observation(self._prompt(suffix, **values), self._prompt("_omitted", said=said))

    def system_prompt(self) -> str:
        return self._prompt("", screen_width=GRID, screen_height=GRID)

    def _open(self) -> Session:
        return self.engine.open_session(system=self.system_prompt())

    def _rebuild(self) -> Session:
        """A fresh session holding the old turns as text, with only the last screenshots kept."""
        old = self.session
        fresh = self._open()
        turns = old.turns if old else []
        keep_from = len(turns) - (self.keep_images - 1)
        for i, turn in enumerate(turns):
            if i >= keep_from or not turn.images:
                fresh.add_turn(turn.text, turn.images, turn.reply)
            else:
                fresh.add_turn(self._without_images[i], (), turn.reply)
        if old is not None:
            old.close()
        self.rebuilds += 1
        return fresh

    def _images_in_context(self) -> int:
        return sum(len(t.images) for t in self.session.turns) if self.session else 0

    def _emit(self, kind: str, step: int, **kw) -> None:
        if self.on_event is not None:
            self.on_event(AgentEvent(kind, step, **kw))

    # --- one model turn -------------------------------------------------------------------------------

    def _ask(self, observation: Observation, shot: Screenshot) -> str:
        """The model's reply, cancelled by the stop switch or the per-step timeout."""
        session = self.session
        text = observation.text
        timed_out = threading.Event()

        def on_timeout() -> None:
            timed_out.set()
            session.cancel()

        timer = threading.Timer(self.step_timeout_s, on_timeout)
        timer.daemon = True
        # The turn starts with ask(); only from then on does a cancel() stop it, so the stop switch is
        # hooked up after it, and checked before the first token: a stop that came in between the step's
        # check and here ends the run now instead of after a whole reply.
        stream = session.ask(text, [shot], self.options)
        self._without_images.append(observation.without_image)
        unregister = self.guard.switch.on_stop(session.cancel)
        timer.start()
        try:
            self.guard.switch.check()
            # A remote server's JSON can carry a lone surrogate ("\ud800"), which no file, terminal or
            # parser takes: from here on the reply is valid text.
            return LONE_SURROGATE.sub("\ufffd", "".join(stream))
        except GenerationCancelled:
            self.guard.switch.check()
            if timed_out.is_set():
                raise _StepTimeout from None
            raise
        finally:
            timer.cancel()
            unregister()

    # --- the loop -------------------------------------------------------------------------------------

    def run(self, task: str) -> RunResult:
        """Carry out `task`; never raises for what a run can run into (stop, errors, limits)."""
        if self.trace:
            self.trace.start(
                task=task,
                engine=self.engine.name,
                executor=self.executor.name,
                mode=self.guard.mode,
                max_steps=self.max_steps,
            )
        self.session = None
        self._without_images = []
        self._would_do = []
        self._steps, self._last_shot, self._deferred, self._dialog_records = 0, None, None, []
        self._by_person = 0
        unasked = []
        if isinstance(self.executor, DialogSource):
            unasked = self.executor.answer_dialogs_with(self._answer_dialog)
        result = RunResult(
            "limit", steps=self.max_steps, message=f"The task was not done within {self.max_steps} steps."
        )
        first = self._prompt("_task", task=task)
        if self.secrets:
            note = prompts.load("secrets").render(placeholders=", ".join(self.secrets.placeholders()))
            first = f"{first.rstrip()}\n\n{note}"
        if self.takeover is not None:  # an addition to the task turn: the system prompt stays Qwen's own
            first = f"{first.rstrip()}\n\n{prompts.load('call_user').render()}"
        observation = Observation(first, self._prompt("_omitted", said=first))
        retries = 0
        step = 0
        try:
            for record in unasked:  # opened by the first page's load, before anyone could be asked
                self._emit("dialog", 0, message=f"{_dialog_line(record)} (before the run started)")
            while self._steps - self._by_person < self.max_steps:
                self._steps += 1
                step = self._steps
                outcome, observation, retries = self._step(step, observation, retries, unasked)
                unasked = []
                if outcome is not None:
                    result = outcome
                    break
                observation = self._between_steps(observation)
        except EmergencyStop as exc:
            result = RunResult("stopped", steps=step, message=str(exc))
        except _StepTimeout:
            result = RunResult("limit", steps=step, message=f"Step {step} took longer than {self.step_timeout_s:g} s.")
        except GenerationCancelled as exc:
            result = RunResult("stopped", steps=step, message=str(exc))
        except QvlError as exc:
            result = RunResult("error", steps=step, message=str(exc))
        except KeyboardInterrupt:  # Ctrl+C: the run is recorded as interrupted, not left unfinished
            where = f"in step {step}" if step else "before the first step"
            result = RunResult("interrupted", steps=step, message=f"Interrupted (Ctrl+C) {where}.")
        finally:
            if isinstance(self.executor, DialogSource):
                self.executor.answer_dialogs_with(None)  # dismissed from now on: no model to ask
            if self.session is not None:
                self.session.close()
            self._write_dialog_steps()
        extra = {}
        if self.executor.name == "dry-run":
            status = DRY_RUN if result.status == "success" else result.status
            result = replace(result, status=status, dry_run=True, would_do=tuple(self._would_do))
            extra = {"dry_run": True, "would_do": list(result.would_do)}
        if self.trace:
            self.trace.end(
                status=result.status, answer=result.answer, steps=result.steps, message=result.message, **extra
            )
        self._emit("done", result.steps, message=result.status)
        return result

    def _step(
        self, step: int, observation: Observation, retries: int, unasked: list[dict] = ()
    ) -> tuple[RunResult | None, Observation, int]:
        """One step. Returns (the run's result when it ended, the next observation, retries so far)."""
        record: dict = {"step": step, "observation": observation.text, "actions": [], "results": []}
        self._record = record
        if unasked:
            record["dialogs_before"] = [dict(d, why="dismissed: it opened before the run started") for d in unasked]
        timings: dict = {}
        t0 = time.perf_counter()
        try:
            self.guard.switch.check()
            shot = self.executor.observe()
            self._raise_deferred()
            timings["capture_ms"] = (time.perf_counter() - t0) * 1000
            if getattr(self.executor, "reused_capture", False):
                record["capture"] = "reused"  # the screen grabbed while waiting for it to settle: no new grab
            record["screen"] = _screen(shot)
            if self.trace:
                t = time.perf_counter()
                record["screenshot"] = self.trace.screenshot(step, shot)
                timings["trace_png_ms"] = (time.perf_counter() - t) * 1000
            self._last_shot = (shot, record.get("screenshot", ""))
            if self.session is None:
                self.session = self._open()
            elif self._images_in_context() >= self.max_images:
                self.session = self._rebuild()
                record["context_rebuilt"] = True
            self._emit("step", step, shot=shot)
            t = time.perf_counter()
            reply = self._ask(observation, shot)
            timings["model_ms"] = (time.perf_counter() - t) * 1000
            record["reply"] = reply
            if self.session.last_stats is not None:
                record["engine"] = self.session.last_stats.as_dict()
            self._emit("reply", step, message=reply)
            try:
                actions = parse_actions(reply)
            except ParseError as exc:
                return self._retry(step, record, str(exc), retries)
            record["actions"] = [A.to_arguments(a) for a in actions]
            t = time.perf_counter()
            try:
                finished = self._act(step, actions, shot, record)
            except ActionError as exc:
                return self._retry(step, record, str(exc), retries)
            timings["act_ms"] = (time.perf_counter() - t) * 1000
            if finished is not None:
                return finished, observation, 0
            t = time.perf_counter()
            self.executor.wait_until_settled(self.settle_timeout_s)
            self._raise_deferred()
            timings["settle_ms"] = (time.perf_counter() - t) * 1000
            results = "\n".join(f"{r['action']}: {r['message']}" for r in record["results"])
            return None, self._observation("_step", results, results=results), 0
        except (QvlError, _StepTimeout) as exc:
            record["error"] = str(exc) or type(exc).__name__
            raise
        finally:
            timings["total_ms"] = (time.perf_counter() - t0) * 1000
            record["timings"] = {k: round(v, 2) for k, v in timings.items()}
            if self.trace:
                self.trace.step(record)
            self._write_dialog_steps()

    def _between_steps(self, observation: Observation) -> Observation:
        """A take-over asked for during the step: the person acts now, and the model is told what they did."""
        done = self.takeover.between_steps(self._steps + 1) if self.takeover is not None else None
        if done is None:
            return observation
        records, words = done
        self._steps += len(records)  # the person's steps are numbered after the agent's, in one trace
        self._by_person += len(records)
        return Observation(f"{observation.text.rstrip()}\n\n{words}", f"{observation.without_image.rstrip()}\n{words}")

    def _retry(self, step: int, record: dict, error: str, retries: int) -> tuple[RunResult | None, Observation, int]:
        record["error"] = error
        self._emit("error", step, message=error)
        done = [r["action"] for r in record["results"] if r.get("ok")]
        if done:  # the model must know which of its actions did run before the failing one
            error = f"{error} (Done before that: {'; '.join(done)}.)"
        retries += 1
        if retries > self.max_retries:
            return (
                RunResult(
                    "failure",
                    steps=step,
                    message=f"Gave up after {retries} unusable replies in a row: {error}",
                ),
                Observation("", ""),
                retries,
            )
        return None, self._observation("_error", f"Not carried out: {error}", error=error), retries

    def _act(self, step: int, actions: list[A.Action], shot: Screenshot, record: dict) -> RunResult | None:
        """Run a reply's actions in order; the guard checks each right before it runs."""
        answer: str | None = None
        self.guard.check_reply(actions)
        for action in actions:
            try:
                pixels = self.guard.check(action, shot)
            except ActionError as exc:  # the report shows the guard's verdict
                record["results"].append(
                    {"action": A.describe(action), "ok": False, "message": str(exc), "guard": "refused"}
                )
                raise
            self._emit("action", step, action=action, pixels=tuple(pixels), shot=shot)
            self.guard.switch.check()  # a watcher of "action" (the click marker) may have refused it
            if isinstance(action, A.Answer):
                answer = action.text
                result = ActionResult(True, "answered")
            elif isinstance(action, A.Terminate):
                record["results"].append({"action": A.describe(action), "ok": True, "message": action.status})
                return RunResult(action.status, answer or "", step, f"The model ended the task: {action.status}.")
            elif isinstance(action, A.CallUser):
                if self.takeover is None:
                    raise ActionError("No person can take over in this run: carry on, or terminate with failure.")
                self.takeover.request(action.text)  # the loop pauses once this step has ended
                result = ActionResult(True, f"the person was asked to take over: {action.text}")
            elif isinstance(action, A.Wait):
                self.guard.sleep(action.seconds)  # wakes at once on the emergency stop
                result = ActionResult(True, f"waited {action.seconds:g} s")
            else:
                self._typed_in_dialogs = []
                try:
                    if isinstance(action, A.HandleDialog):
                        raise ActionError(
                            "No dialog is open: handle_dialog answers a dialog, and you are asked for it when "
                            "the page opens one."
                        )
                    result = self.executor.execute(self.secrets.reveal_action(action), shot)
                    self._raise_deferred()
                except ActionError as exc:
                    message = self.secrets.mask(str(exc))
                    points = [list(p) for p in pixels]
                    record["results"].append(
                        {"action": A.describe(action), "ok": False, "message": message, "pixels": points}
                    )
                    if message != str(exc):
                        raise ActionError(message) from None
                    raise
                result = ActionResult(result.ok, self.secrets.mask(result.message), self.secrets.mask(result.detail))
                for opened, typed in zip(result.detail.get("dialogs", ()), self._typed_in_dialogs, strict=False):
                    if typed is not None and "text" in opened:
                        opened["typed"] = typed  # for the export, as in the dialog's own step
                self._typed_in_dialogs = []
                if self.executor.name == "dry-run":
                    self._would_do.append(describe_pixels(action, pixels))
                if isinstance(action, A.Type):
                    self.typed[step, len(record["results"])] = self.secrets.segments(action.text)
            record["results"].append(
                {
                    "action": A.describe(action),
                    "ok": result.ok,
                    "message": result.message,
                    "pixels": [list(p) for p in pixels],
                    **({"detail": result.detail} if result.detail else {}),
                }
            )
            self._emit("result", step, message=result.message, action=action, pixels=tuple(pixels))
        if answer is not None:
            return RunResult("success", answer, step, "The model answered.")
        return None

    # --- a page's dialog ------------------------------------------------------------------------------

    def _raise_deferred(self) -> None:
        """Raise the stop or timeout met while a dialog was being answered (now that Playwright returned)."""
        if self._deferred is not None:
            exc, self._deferred = self._deferred, None
            raise exc

    def _write_dialog_steps(self) -> None:
        records, self._dialog_records = self._dialog_records, []
        if self.trace:
            for record in records:
                self.trace.step(record)

    def _answer_dialog(self, dialog: Dialog) -> A.HandleDialog:
        """The executor's question while a dialog blocks the page: one model turn, recorded as a step of its
        own. Never raises (Playwright's event dispatch runs it): a stop or a timeout is kept for
        `_raise_deferred`, and the dialog is dismissed."""
        seen = self.secrets.mask(
            {"type": dialog.kind, "message": dialog.message, "default": dialog.default, "url": dialog.url}
        )
        if self._deferred is not None or self._steps >= self.max_steps or self._last_shot is None:
            why = "the step limit was reached" if self._last_shot else "it opened before the first screenshot"
            why = "the run is ending" if self._deferred is not None else why
            note = dict(seen, accept=False, why=f"dismissed: {why}")
            if self._record is not None:  # the step it interrupted shows it
                self._record.setdefault("dialogs", []).append(note)
            self._emit("dialog", self._steps, message=f"{_dialog_line(note)} ({why})")
            return A.HandleDialog(False)
        self._steps += 1
        step = self._steps
        shot, screenshot = self._last_shot
        fields = _fields(seen, dialog.during)
        observation = self._observation("_dialog", self._prompt("_dialog", **fields), **fields)
        record: dict = {"step": step, "observation": observation.text, "dialog": seen}
        if screenshot:
            record["screenshot"] = screenshot  # the page behind the dialog, as the model last saw it
            record["screen"] = _screen(shot)
        t0 = time.perf_counter()
        choice, revealed, why = A.HandleDialog(False), A.HandleDialog(False), ""
        try:
            self.guard.switch.check()
            if self.session is None:
                self.session = self._open()
            elif self._images_in_context() >= self.max_images:
                self.session = self._rebuild()
                record["context_rebuilt"] = True
            self._emit("step", step, shot=shot)
            reply = self._ask(observation, shot)
            record["reply"] = reply
            self._emit("reply", step, message=reply)
            try:
                actions = parse_actions(reply)
            except ParseError as exc:
                actions, why = [], f"the reply could not be read: {exc}"
            if len(actions) == 1 and isinstance(actions[0], A.HandleDialog):
                self.guard.check(actions[0], shot)  # confirm mode asks; a no stops the run
                text = actions[0].text
                revealed = replace(actions[0], text=self.secrets.reveal(text) if text is not None else None)
                choice = actions[0]
            elif actions:
                why = f"the reply was {A.describe(actions[0])}, not one handle_dialog"
        except ActionError as exc:  # an unknown secret's placeholder in the text
            why = str(exc)
        except (QvlError, _StepTimeout, GenerationCancelled, KeyboardInterrupt) as exc:
            self._deferred = exc
            why = {_StepTimeout: "the step took too long", KeyboardInterrupt: "interrupted (Ctrl+C)"}.get(
                type(exc), "the run was stopped"
            )
        answered = dict(seen, accept=choice.accept, **({"text": choice.text} if choice.text is not None else {}))
        message = _dialog_line(answered) + (f" ({why})" if why else "")
        if why:
            record["error"] = why
        if self.secrets and choice.accept and choice.text is not None and dialog.kind == "prompt":
            # What the prompt got, as the model wrote it: the export reads a secret where it typed a
            # declared placeholder (the trace holds names, never values).
            answered["typed"] = self.secrets.segments(choice.text)
        if dialog.during:
            answered["during"] = dialog.during
            self._typed_in_dialogs.append(answered.get("typed"))
        record["actions"] = [A.to_arguments(choice)]
        record["results"] = [
            {"action": A.describe(choice), "ok": True, "message": message, "detail": {"dialog": answered}}
        ]
        record["timings"] = {"total_ms": round((time.perf_counter() - t0) * 1000, 2)}
        self._dialog_records.append(record)
        self._emit("dialog", step, message=message)
        return revealed


def _screen(shot: Screenshot) -> dict:
    return {"left": shot.left, "top": shot.top, "width": shot.width, "height": shot.height, "scale": shot.scale}
