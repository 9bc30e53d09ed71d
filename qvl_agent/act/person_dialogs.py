"""A page's dialogs (alert, confirm, prompt, beforeunload) answered by the person in a headed Chromium's own
window, and what they chose, as the browser reports it (for `act.recorder`).

Playwright leaves a dialog open as long as some handler of its "dialog" event does not answer it, and a
headed Chromium then shows it as it always does: the person reads it and clicks OK or Cancel (or types
into a prompt) themself. Playwright does not say what they chose, so each tab gets a DevTools session of
its own (`watch`) that listens to `Page.javascriptDialogOpening` and `Page.javascriptDialogClosed`: the
second carries the browser's own `result` and `userInput`. Nothing here comes from the page's scripts, so
a page cannot make the recording hold an answer the person did not give.

`PersonDialogs.leave_open` is the answer given to the executor's dialog handler (`PageDialogs`): None,
the dialog is the person's. Each dialog closed in the window reaches `answered(page, record)` as
{"type", "message", "default", "url", "accept"} and "text" for an accepted prompt, the shape
`PageDialogs` records for the model. `dismiss_open` closes what is still open when the recording stops.
Playwright comes in only as the context and pages passed in and the error type it raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from qvl_agent.act.base import Dialog

KINDS = ("alert", "confirm", "prompt", "beforeunload")
# A prompt that asks for one of these is asking for a secret: what the person types there is one.
SECRET_WORDS = re.compile(
    r"\b(password|passcode|passphrase|pin|one[- ]time (?:code|password)|security code|secret|token)\b", re.I
)


def prompt_secret(message: str) -> str:
    """The secret's name a prompt asks for (`PASSWORD`, `PIN`, `SECURITY_CODE`), or "" when it asks for no
    secret."""
    match = SECRET_WORDS.search(message or "")
    return re.sub(r"[^A-Z]+", "_", match.group(1).upper()) if match else ""


class PersonDialogs:
    def __init__(self, context, error_type: type[Exception], answered: Callable[[object, dict], None]):
        self._context = context
        self._error_type = error_type
        self._answered = answered
        self._sessions: list[tuple[object, object]] = []  # (page, its DevTools session)
        self._open: dict[int, tuple[object, dict]] = {}  # id(session) -> (page, the dialog as it opened)
        self._ending = False
        self.unread: list[str] = []  # dialogs whose answer could not be read, for the person at the end

    @staticmethod
    def leave_open(_dialog: Dialog) -> None:
        """The executor's answer to every dialog: none (the person answers it in the window)."""
        return None

    @property
    def open(self) -> bool:
        """Whether a dialog is open in some tab now (its page is blocked: nothing can be read from it)."""
        return bool(self._open)

    def watch(self, page) -> None:
        """Listen to `page`'s dialogs; a page that is already gone is left out."""
        try:
            session = self._context.new_cdp_session(page)
            session.on("Page.javascriptDialogOpening", lambda event: self._opening(page, session, event))
            session.on("Page.javascriptDialogClosed", lambda event: self._closed(session, event))
            session.send("Page.enable")
        except self._error_type:
            return
        self._sessions.append((page, session))

    def _opening(self, page, session, event: dict) -> None:
        kind = event.get("type")
        if kind not in KINDS or not isinstance(event.get("message"), str):
            return
        default = event.get("defaultPrompt") if isinstance(event.get("defaultPrompt"), str) else ""
        url = event.get("url") if isinstance(event.get("url"), str) else ""
        self._open[id(session)] = (page, {"type": kind, "message": event["message"], "default": default, "url": url})

    def _closed(self, session, event: dict) -> None:
        page, seen = self._open.pop(id(session), (None, None))
        if seen is None or self._ending:
            return
        result, text = event.get("result"), event.get("userInput")
        if not isinstance(result, bool):
            self.unread.append(f"the answer to {Dialog(seen['type'], seen['message']).describe()} could not be read")
            return
        record = dict(seen, accept=result)
        if result and seen["type"] == "prompt":
            record["text"] = text if isinstance(text, str) else ""
        self._answered(page, record)

    def resume(self) -> None:
        """Record the person's answers (again: a run taken over a second time)."""
        self._ending = False

    def dismiss_open(self) -> list[dict]:
        """Cancel every dialog still open (the recording is ending); returns them, none of them recorded."""
        self._ending = True
        left = []
        for _page, session in self._sessions:
            if id(session) not in self._open:
                continue
            left.append(self._open[id(session)][1])
            try:
                session.send("Page.handleJavaScriptDialog", {"accept": False})
            except self._error_type:
                pass  # its page closed meanwhile
        self._open.clear()
        return left
