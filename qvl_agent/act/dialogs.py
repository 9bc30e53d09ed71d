"""A page's dialogs (alert, confirm, prompt, beforeunload) in the browser executor: each one is answered
on the spot, because it blocks its page, and Playwright's sync API runs the handler while the action that
opened it is still in flight.

`PageDialogs.on_dialog` is the context's "dialog" handler. It asks the callback the agent gave
(`answer_with`: one model turn; a recorder's returns None, which leaves the dialog open for the person to
answer in the headed window) or, when there is none (the first page's load, before the run starts, or
after it ended), dismisses the dialog; nothing is ever accepted unasked. Every dialog and its answer is
recorded: those met while an action ran go with that action (`end_action`, into its result's detail, what
`export` expects before that step); those dismissed unasked wait for `answer_with` to hand them over.
Playwright comes in only as the dialog objects it passes and the error type it raises.
"""

from __future__ import annotations

from qvl_agent import actions as A
from qvl_agent.act.base import Dialog, DialogAnswer


class PageDialogs:
    def __init__(self, error_type: type[Exception]):
        self._error_type = error_type
        self._answer: DialogAnswer | None = None
        self.acting = ""  # the action in flight, as `actions.describe` writes it
        self._during: list[dict] = []  # answered while that action was in flight
        self._unasked: list[dict] = []  # dismissed before anyone could be asked

    @property
    def answer(self) -> DialogAnswer | None:
        return self._answer

    def answer_with(self, answer: DialogAnswer | None) -> list[dict]:
        """Answer each dialog from now on through `answer` (None: dismiss); returns those dismissed so far."""
        self._answer = answer
        unasked, self._unasked = self._unasked, []
        return unasked

    def end_action(self) -> list[dict]:
        """The action in flight returned: the dialogs it opened, with their answers."""
        during, self._during, self.acting = self._during, [], ""
        return during

    def on_dialog(self, dialog) -> None:
        """Answer a dialog at once. Never raises: this runs inside Playwright's event dispatch, where an
        exception would leave the dialog open and the action that opened it hanging."""
        try:
            url = dialog.page.url if dialog.page is not None else ""
        except self._error_type:
            url = ""
        seen = Dialog(dialog.type, dialog.message, dialog.default_value, url, self.acting)
        choice = self._answer(seen) if self._answer is not None else A.HandleDialog(False)
        if choice is None:
            return  # the person's: they answer it in the browser window (`act.person_dialogs`)
        text = choice.text if choice.accept and seen.kind == "prompt" else None
        try:
            if not choice.accept:
                dialog.dismiss()
            elif text is not None:
                dialog.accept(text)
            else:
                dialog.accept()
        except self._error_type:
            pass  # its page closed meanwhile
        record = {"type": seen.kind, "message": seen.message, "accept": choice.accept}
        if text is not None:
            record["text"] = text
        if self._answer is None:
            self._unasked.append(record)
        elif self.acting:
            self._during.append(record)


def answered(record: dict) -> str:
    """ "it opened a confirm dialog: 'Delete?', which was accepted" for a recorded dialog."""
    how = "accepted" if record["accept"] else "dismissed"
    if "text" in record:
        how += f" with the text {record['text']!r}"
    return f"it opened {Dialog(record['type'], record['message']).describe()}, which was {how}"
