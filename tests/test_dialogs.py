"""A page's dialogs on the record: `browse` asks the model about each one (one turn, a step of its own in
the trace, the report and the terminal), never accepts one unasked, and the exported script answers
exactly the recorded dialog and fails on any other, quoting its message. Real Chromium, pages on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.pages.helpers import ENV, browse, call, click_at, element_centres, exported, replay_script
from tests.pages.server import PageServer

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def at(server):
    return element_centres(server.url + "/dialogs.html", ["#delete", "#rename", "#odd", "#later"])


def test_a_confirm_goes_to_the_model_is_recorded_and_replays_exactly(tmp_path, server, at):
    url = server.url + "/dialogs.html"
    replies = [
        click_at(at["#delete"]),
        call(action="handle_dialog", accept=True),  # the dialog's own turn, while the click is in flight
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Delete the note")
    assert result.returncode == 0, result.stderr
    message = 'Delete the note "groceries"?\nThis cannot be undone.'
    line = 'step 2: confirm dialog "Delete the note \\"groceries\\"?\\nThis cannot be undone.": accepted'
    assert line in result.stdout
    trace = read_trace(tmp_path / "trace")
    click, dialog, _ = trace.steps
    assert click["results"][0]["detail"]["dialogs"] == [{"type": "confirm", "message": message, "accept": True}]
    assert "which was accepted" in click["results"][0]["message"]
    assert dialog["dialog"]["message"] == message and dialog["actions"] == [{"action": "handle_dialog", "accept": True}]
    assert json.dumps(message)[1:-1] in dialog["observation"]  # the model read the message, quoted
    report = (tmp_path / "trace" / "report.html").read_text()
    assert "confirm dialog" in report and "This cannot be undone." in report
    source = exported(tmp_path)
    assert 'DIALOGS.expect("confirm", "Delete the note \\"groceries\\"?\\nThis cannot be undone.", True)' in source
    assert source.index("DIALOGS.expect(") < source.index('get_by_role("button", name="Delete note"')
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source

    # The site changed under the script: another question, or one dialog more, fails it with the message.
    changed = replay_script(tmp_path / "out.py", "--timeout", "2", "--url", url + "?variant=changed")
    assert changed.returncode == 1
    assert "unexpected confirm dialog 'Delete EVERY note?' (it was dismissed)" in changed.stderr
    assert "Replay failed at step " in changed.stderr and '"Delete note" button' in changed.stderr  # the step, in words
    extra = replay_script(tmp_path / "out.py", "--timeout", "2", "--url", url + "?variant=extra")
    assert extra.returncode == 1
    assert "unexpected alert dialog 'Unexpected \"news\"!\\nSecond line'" in extra.stderr


def test_a_prompt_s_text_a_dismissal_and_a_hostile_message_export_as_literals_and_replay(tmp_path, server, at):
    url = server.url + "/dialogs.html"
    replies = [
        click_at(at["#rename"]),
        call(action="handle_dialog", accept=True, text='weekly "shop"\n'),
        click_at(at["#odd"]),
        call(action="handle_dialog", accept=False),
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Rename the note")
    assert result.returncode == 0, result.stderr
    odd = '"); import os #\n\'\'\' """ \\x41 \u2028 {{NOPE}} end'
    dialogs = [s["results"][0]["detail"].get("dialogs") for s in read_trace(tmp_path / "trace").steps[0:4:2]]
    assert dialogs == [
        [{"type": "prompt", "message": "New name for the note:", "accept": True, "text": 'weekly "shop"\n'}],
        [{"type": "confirm", "message": odd, "accept": False}],
    ]
    source = exported(tmp_path)  # the gate passed it
    assert 'DIALOGS.expect("prompt", "New name for the note:", True, "weekly \\"shop\\"\\n")' in source
    expects = [line.strip() for line in source.splitlines() if line.strip().startswith("DIALOGS.expect(")]
    assert len(expects) == 2 and "import os #" in expects[1] and expects[1].endswith(", False)")
    assert "os.environ" not in expects[1]  # {{NOPE}} is no declared secret: text, as the page wrote it
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source


def test_a_timer_s_dialog_a_reply_that_is_no_answer_and_the_start_page_s_dialog(tmp_path, server, at):
    url = server.url + "/dialogs.html?variant=load"
    replies = [
        click_at(at["#later"]),  # its alert opens 0.1 s later, while the page settles: no action in flight
        call(action="left_click", coordinate=[10, 10]),  # not an answer: the alert is dismissed
        click_at(at["#delete"]),
        call(action="handle_dialog", accept=False),
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Keep the note")
    assert result.returncode == 0, result.stderr
    assert 'step 0: alert dialog "Welcome back": dismissed (before the run started)' in result.stdout
    assert 'step 2: alert dialog "Time to shop": dismissed (the reply was left_click at (10, 10)' in result.stdout
    steps = read_trace(tmp_path / "trace").steps
    assert steps[0]["dialogs_before"][0]["message"] == "Welcome back"
    assert steps[1]["dialog"]["message"] == "Time to shop" and "not one handle_dialog" in steps[1]["error"]
    source = exported(tmp_path)
    assert 'START_DIALOGS = [["alert", "Welcome back", False]]' in source
    assert 'DIALOGS.expect("alert", "Time to shop", False)' in source
    # ...and waited for before the next click, which a replay sending it while the alert is open would lose
    waited = source.index('DIALOGS.opened("alert", "Time to shop")')
    assert source.index('name="Remind me"') < waited < source.index('name="Delete note"')
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source
    assert "Note kept" in source  # the end state the dismissal led to is checked


def _playwright_trace(path) -> set[str]:
    """The entries of a Playwright trace.zip, which must hold its action and network logs."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert {"trace.trace", "trace.network"} <= names, names
    return names


def test_browse_writes_playwright_s_trace_and_the_report_links_it_but_not_with_a_secret(
    tmp_path, server, at, monkeypatch
):
    url = server.url + "/dialogs.html"
    replies = [click_at(at["#delete"]), call(action="handle_dialog", accept=False), call(action="terminate",
               status="success")]  # fmt: skip
    result = browse(tmp_path, url, replies, "Keep the note")
    assert result.returncode == 0, result.stderr
    names = _playwright_trace(tmp_path / "trace" / "trace.zip")
    assert any(name.startswith("resources/") for name in names)  # snapshots and screenshots
    assert '<a href="trace.zip">trace.zip</a>' in (tmp_path / "trace" / "report.html").read_text()

    limited = tmp_path / "limited"  # a run that fails keeps its trace too
    limited.mkdir()
    result = browse(limited, url, [click_at(at["#later"])] * 3, "Keep the note", "--max-steps", "1")
    assert result.returncode == 1, result.stderr
    _playwright_trace(limited / "trace" / "trace.zip")

    secret = tmp_path / "secret"
    secret.mkdir()
    monkeypatch.setenv("QVL_SECRET_PIN", "4711")
    result = browse(secret, url, replies, "Keep the note {{PIN}}", "--secret", "PIN")
    assert result.returncode == 0, result.stderr
    assert not (secret / "trace" / "trace.zip").exists()
    assert "no trace.zip: a run with a secret keeps no Playwright trace" in result.stderr


def test_a_recorded_dialog_replays_in_the_sandbox_and_through_a_healed_step(tmp_path, server):
    """The heal hook inside the sandbox asks about a renamed button whose click opens the recorded confirm;
    the script's own handler answers it, and both replays bring back Playwright's trace."""
    server.site = "a"
    url = server.url + "/site/confirm.html"
    at = element_centres(url, ["#delete"])
    replies = [click_at(at["#delete"]), call(action="handle_dialog", accept=True), call(action="terminate",
               status="success")]  # fmt: skip
    result = browse(tmp_path, url, replies, "Delete the note")
    assert result.returncode == 0, result.stderr
    exported(tmp_path)
    env = dict(ENV, QVL_CONFIG_DIR=str(tmp_path / "config"))
    server.clear()
    replayed = run_cli("replay", str(tmp_path / "out.py"), env=env, timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    assert server.records("confirm") == [{"deleted": True}]
    _playwright_trace(tmp_path / "out.out" / "trace.zip")

    server.site = "b"  # "Delete note" is now "Remove note"
    grounding = tmp_path / "heal-replies.json"
    grounding.write_text(json.dumps([click_at(at["#delete"])]))  # the same place, the new name
    server.clear()
    healed = run_cli("replay", "--heal", "--engine", f"replay:{grounding}", "--trace-dir", str(tmp_path / "heals"),
                     "--step-timeout", "3", str(tmp_path / "out.py"), env=env, timeout=300)  # fmt: skip
    assert healed.returncode == 0, healed.stderr
    assert server.records("confirm") == [{"deleted": True}]
    assert 'get_by_role("button", name="Remove note", exact=True)' in (tmp_path / "out.healed.py").read_text()
    _playwright_trace(tmp_path / "heals" / "trace.zip")
    assert '<a href="trace.zip">trace.zip</a>' in (tmp_path / "heals" / "report.html").read_text()


def test_leaving_a_page_that_asks_first_is_the_model_s_choice_and_replays(tmp_path, server, at):
    url = server.url + "/dialogs.html?variant=guard"
    leave = element_centres(url, ["#leave"])["#leave"]
    replies = [
        click_at(at["#rename"]),  # a click first: Chromium asks before unloading only a page one used
        call(action="handle_dialog", accept=False),
        click_at(leave),
        call(action="handle_dialog", accept=True),  # leave the page
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Leave the page")
    assert result.returncode == 0, result.stderr
    assert "step 4: beforeunload dialog" in result.stdout and ": accepted" in result.stdout
    steps = read_trace(tmp_path / "trace").steps
    assert steps[2]["results"][0]["detail"]["dialogs"][0]["type"] == "beforeunload"
    source = exported(tmp_path)
    assert 'DIALOGS.expect("beforeunload", ' in source and "/help.html" in source
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source
