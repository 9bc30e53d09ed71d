"""A page's dialogs on the record: `browse` asks the model about each one (one turn, a step of its own in
the trace, the report and the terminal), never accepts one unasked, and the exported script answers
exactly the recorded dialog and fails on any other, quoting its message. Real Chromium, pages on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from qvl_agent.trace import read_trace
from tests.pages.helpers import browse, call, click_at, element_centres, exported, replay_script
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
    replayed = replay_script(tmp_path / "out.py", "--timeout", "5")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source

    # The site changed under the script: another question, or one dialog more, fails it with the message.
    changed = replay_script(tmp_path / "out.py", "--timeout", "3", "--url", url + "?variant=changed")
    assert changed.returncode == 1
    assert "unexpected confirm dialog 'Delete EVERY note?' (it was dismissed)" in changed.stderr
    extra = replay_script(tmp_path / "out.py", "--timeout", "3", "--url", url + "?variant=extra")
    assert extra.returncode == 1
    assert "unexpected alert dialog 'Unexpected \"news\"!\\nSecond line'" in extra.stderr
