"""`qvl-agent record` with the page's own dialogs: the person answers them in the window, and the script
answers exactly as they did.

End to end (the person played by xdotool on the test's X display, as in tests/test_record.py): page 1 is a
form (two text fields, a select chosen with the keyboard, a checkbox, a password) submitted to page 2, a
table where the person deletes order #1002 by its own button and accepts the confirm() it asks. The
export replays on the same site; on version B (an order added, the rows reordered, the button renamed to
"Remove") it fails and `replay --heal` repairs it, and only #1002 is deleted each time. The password is
never in the trace, the report or the script. A second recording answers a prompt() for a PIN (a secret:
the script reads it from $QVL_SECRET_PIN) and dismisses a confirm().
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from qvl_agent.act.person_dialogs import PersonDialogs, prompt_secret
from tests.conftest import ROOT
from tests.pages.helpers import ENV
from tests.pages.server import PageServer
from tests.support.heal_oracle import DomGroundingOracle, start
from tests.test_record import (
    PASSWORD,
    Person,
    _key,
    centres,
    ctrl_c,
    errors,
    replay,
    screen,
    start_recording,
    viewport_origin,
    wait_for,
    wait_for_dialog,
)

# --- unit: what the browser reports ---------------------------------------------------------------------


class FakeSession:
    def __init__(self):
        self.handlers: dict = {}
        self.sent: list = []

    def on(self, event, handler):
        self.handlers[event] = handler

    def send(self, method, params=None):
        self.sent.append((method, params))


class FakeContext:
    def __init__(self):
        self.sessions: list[FakeSession] = []

    def new_cdp_session(self, _page):
        self.sessions.append(FakeSession())
        return self.sessions[-1]


def test_a_dialog_closed_in_the_window_is_the_browsers_account_of_the_answer():
    context, answered = FakeContext(), []
    dialogs = PersonDialogs(context, RuntimeError, lambda page, record: answered.append((page, record)))
    dialogs.watch("tab")
    session = context.sessions[0]
    assert session.sent == [("Page.enable", None)]
    opening, closed = session.handlers["Page.javascriptDialogOpening"], session.handlers["Page.javascriptDialogClosed"]
    opening({"type": "prompt", "message": "Your PIN?", "defaultPrompt": "", "url": "http://x/"})
    assert dialogs.open and PersonDialogs.leave_open(None) is None
    closed({"result": True, "userInput": "4321"})
    assert answered == [("tab", {"type": "prompt", "message": "Your PIN?", "default": "", "url": "http://x/",
                                 "accept": True, "text": "4321"})]  # fmt: skip
    assert not dialogs.open
    opening({"type": "confirm", "message": "Sure?", "url": "http://x/"})
    closed({"result": False, "userInput": ""})
    assert answered[-1][1] == {"type": "confirm", "message": "Sure?", "default": "", "url": "http://x/",
                               "accept": False}  # fmt: skip
    closed({"result": True})  # no dialog open: nothing to record
    opening({"type": "eval", "message": "x"})  # not a dialog kind
    opening({"type": "alert", "message": ["not", "text"]})
    assert not dialogs.open and len(answered) == 2
    opening({"type": "alert", "message": "Hi"})
    closed({"result": "yes"})
    assert len(answered) == 2 and "could not be read" in dialogs.unread[0]


def test_a_dialog_still_open_at_the_end_is_dismissed_and_not_recorded():
    context, answered = FakeContext(), []
    dialogs = PersonDialogs(context, RuntimeError, lambda page, record: answered.append(record))
    dialogs.watch("tab")
    session = context.sessions[0]
    session.handlers["Page.javascriptDialogOpening"]({"type": "confirm", "message": "Leave?"})
    assert [d["message"] for d in dialogs.dismiss_open()] == ["Leave?"]
    assert session.sent[-1] == ("Page.handleJavaScriptDialog", {"accept": False})
    session.handlers["Page.javascriptDialogClosed"]({"result": False, "userInput": ""})
    assert answered == [] and not dialogs.open


def test_a_prompt_that_asks_for_a_secret_names_it():
    assert prompt_secret("Your PIN to confirm?") == "PIN"
    assert prompt_secret("Enter your password again") == "PASSWORD"
    assert prompt_secret("Type the one-time code we sent") == "ONE_TIME_CODE"
    assert prompt_secret("Your name?") == ""
    assert prompt_secret("Which spinach?") == ""


# --- end to end -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def _files(tmp_path):
    """The recording's files: the script and everything in the run folder (trace, report, screenshots)."""
    return [tmp_path / "out.py", *(p for p in (tmp_path / "trace").rglob("*") if p.is_file())]


def _steps(tmp_path) -> list[dict]:
    trace = (tmp_path / "trace" / "trace.jsonl").read_text()
    return [json.loads(line) for line in trace.splitlines() if '"type": "step"' in line]


ACCOUNT = {"name": "Ada Lovelace", "email": "ada@example.org", "plan": "Pro", "news": True, "pw": PASSWORD}


@pytest.mark.browser
@pytest.mark.slow
def test_a_form_a_row_and_its_confirm_replay_and_heal(x_display, tmp_path, server):
    server.site = "a"
    server.clear()
    form_url, rows_url = f"{server.url}/site/rec-form.html", f"{server.url}/site/rec-rows.html"
    form = centres(form_url, ["#name", "#email", "label:has(#news)", "#pw", "#go"])
    row = centres(rows_url, ["tr:nth-of-type(2) button"])

    proc = start_recording(tmp_path, form_url)
    try:
        person = Person(viewport_origin())
        person.click(form["#name"])
        person.type("Ada Lovelace")
        person.click(form["#email"])
        person.type("ada@example.org")
        _key("Tab")  # to the plan
        _key("Down")  # Pro
        person.click((form["label:has(#news)"][0] + 30, form["label:has(#news)"][1]))  # the label's text
        person.click(form["#pw"])
        person.type(PASSWORD)
        shown = len(server.records("rows-shown"))  # the measuring's own
        person.click(form["#go"])
        wait_for(lambda: server.records("account"), "the form to post")
        wait_for(lambda: len(server.records("rows-shown")) > shown, "the orders page to be painted", 60)
        page = screen()
        person.click(row["tr:nth-of-type(2) button"])  # order #1002's Delete: the page asks with confirm()
        wait_for_dialog(page, what="the confirm over the page")
        assert server.records("rows") == []  # nothing answered it for the person
        _key("Return")  # OK
        wait_for(lambda: server.records("rows"), "the delete to post")
        time.sleep(1.5)  # the recorder reads the quiet page
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    err = errors(tmp_path)
    assert proc.returncode == 0, err
    assert "accepted for you" not in err and "was dismissed" not in err, err
    assert server.records("account") == [ACCOUNT]
    assert server.records("rows") == [{"deleted": "1002"}]

    steps = _steps(tmp_path)
    assert all(step["by"] == "person" for step in steps)
    [dialog] = [step for step in steps if step["actions"][0]["action"] == "handle_dialog"]
    assert dialog["actions"][0] == {"action": "handle_dialog", "accept": True}
    answered = dialog["results"][0]["detail"]["dialog"]
    assert (answered["type"], answered["message"], answered["accept"]) == ("confirm", "Delete order #1002?", True)
    assert "Delete" in answered["during"] and "#1002" in answered["during"]
    opener = steps[steps.index(dialog) - 1]  # the click that opened it, written just before it
    assert opener["results"][0]["detail"]["dialogs"] == [{"type": "confirm", "message": "Delete order #1002?",
                                                          "accept": True}]  # fmt: skip
    assert "Delete order #1002?" in (tmp_path / "trace" / "report.html").read_text()

    source = (tmp_path / "out.py").read_text()
    lines = source.splitlines()
    expect = next(i for i, line in enumerate(lines) if 'DIALOGS.expect("confirm", "Delete order #1002?", True)' in line)
    click = next(i for i, line in enumerate(lines) if '"#1002", exact=True)).get_by_role' in line)
    assert expect < click, source
    assert 'get_by_role("button", name="Delete", exact=True).click()' in lines[click]
    assert 'select_option(label="Pro")' in source, source
    assert 'get_by_role("checkbox", name="Send me news", exact=True).check()' in source, source
    assert 'os.environ["QVL_SECRET_PASSWORD"]' in source
    for path in _files(tmp_path):
        assert PASSWORD.encode() not in path.read_bytes(), f"the password is in {path.name}"

    # The export replays on the same site: the same account, and only #1002 deleted, its confirm accepted.
    server.clear()
    again = replay(tmp_path, str(tmp_path / "out.py"), "-o", str(tmp_path / "replayed"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records("account") == [ACCOUNT]
    assert server.records("rows") == [{"deleted": "1002"}]

    # Version B: an order on top, the rows reordered, the button says "Remove". The script stops there...
    server.site = "b"
    server.clear()
    broken = replay(tmp_path, str(tmp_path / "out.py"), "--step-timeout", "3", "-o", str(tmp_path / "broken"))
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert server.records("rows") == []
    # ... and heals: the grounding model points at #1002's button, and the dialog is answered as recorded.
    oracle = DomGroundingOracle(rows_url, {'in the item that says "#1002"': 'tr:has-text("#1002") button'})
    engine, httpd = start(oracle)
    try:
        server.clear()
        healed = replay(tmp_path, "--heal", "--engine", engine, "--trace-dir", str(tmp_path / "heals"),
                        "--step-timeout", "3", "-o", str(tmp_path / "healed-run"),
                        str(tmp_path / "out.py"))  # fmt: skip
    finally:
        httpd.shutdown()
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert oracle.problems == []
    assert server.records("account") == [ACCOUNT]
    assert server.records("rows") == [{"deleted": "1002"}]
    fixed = (tmp_path / "out.healed.py").read_text()
    assert 'get_by_text("#1002", exact=True)).get_by_role("button", name="Remove", exact=True).click()' in fixed
    assert 'DIALOGS.expect("confirm", "Delete order #1002?", True)' in fixed
    server.clear()
    again = replay(tmp_path, str(tmp_path / "out.healed.py"), "-o", str(tmp_path / "healed-again"))
    assert again.returncode == 0, again.stdout + again.stderr  # the repaired script, no model again
    assert server.records("rows") == [{"deleted": "1002"}]
    for path in [*_files(tmp_path), tmp_path / "out.healed.py", *(tmp_path / "heals").rglob("*.jsonl")]:
        assert PASSWORD.encode() not in path.read_bytes(), f"the password is in {path.name}"


PIN = "7531"


@pytest.mark.browser
@pytest.mark.slow
def test_a_pin_typed_into_a_prompt_is_a_secret_and_a_dismissed_confirm_stays_dismissed(x_display, tmp_path, server):
    server.clear()
    url = f"{server.url}/rec-pin.html"
    button = centres(url, ["#send"])["#send"]
    proc = start_recording(tmp_path, url)
    try:
        person = Person(viewport_origin())
        page = screen()
        person.click(button)
        prompt = wait_for_dialog(page, what="the prompt")
        person.type(PIN)
        _key("Return")
        wait_for_dialog(page, prompt, what="the confirm after the prompt")
        _key("Escape")  # Cancel
        wait_for(lambda: server.records("transfer"), "the transfer to post")
        time.sleep(1.5)
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    err = errors(tmp_path)
    assert proc.returncode == 0, err
    assert server.records("transfer") == [{"pin": PIN, "sent": False}]
    answers = [step["actions"][0] for step in _steps(tmp_path) if step["actions"][0]["action"] == "handle_dialog"]
    assert answers == [{"action": "handle_dialog", "accept": True, "text": "{{PIN}}"},
                       {"action": "handle_dialog", "accept": False}]  # fmt: skip
    source = (tmp_path / "out.py").read_text()
    prompt = 'DIALOGS.expect("prompt", "Your PIN to confirm the transfer?", True, os.environ["QVL_SECRET_PIN"])'
    assert prompt in source, source
    assert 'DIALOGS.expect("confirm", "Send 10 EUR to Bob now?", False)' in source
    assert "QVL_SECRET_PIN" in err
    for path in _files(tmp_path):
        assert PIN.encode() not in path.read_bytes(), f"the PIN is in {path.name}"

    server.clear()
    env = dict(os.environ, PYTHONPATH=str(ROOT), QVL_CONFIG_DIR=str(tmp_path / "config"), QVL_SECRET_PIN=PIN, **ENV)
    args = [sys.executable, "-m", "qvl_agent", "replay", str(tmp_path / "out.py"), "-o", str(tmp_path / "replayed")]
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records("transfer") == [{"pin": PIN, "sent": False}]
