"""`qvl-agent browse` end to end: a replayed model drives real Chromium against pages served on 127.0.0.1,
the run is exported with --export, and the exported script replays it with plain `python` in a fresh
browser. The end state is checked where the page leaves it: in what the page posted to the test server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.pages.helpers import (
    ENV,
    browse,
    call,
    click_at,
    element_centres,
    exported,
    measure_along,
    replay_script,
    write_replay,
)
from tests.pages.server import PageServer

pytestmark = [
    pytest.mark.browser,
]


@pytest.fixture
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def test_login_form_run_exports_a_script_that_signs_in_again(tmp_path, server):
    url = server.url + "/login.html"
    at = element_centres(url, ["#username", "#password", "text=Remember me", "button"])
    replies = [
        click_at(at["#username"]),
        call(action="type", text="alice"),
        click_at(at["#password"]),
        call(action="type", text="s3cret"),
        click_at(at["text=Remember me"]),  # the label's text: resolves to the checkbox it labels
        click_at(at["button"]),
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Sign in as alice with password s3cret and stay signed in")
    assert result.returncode == 0, result.stderr
    assert f"report: {tmp_path / 'trace' / 'report.html'}" in result.stderr
    expected = {"username": "alice", "password": "s3cret", "remember": "yes"}
    assert server.records("login") == [expected]

    source = exported(tmp_path)
    assert 'get_by_role("textbox", name="Username", exact=True).fill("alice")' in source
    assert 'get_by_role("checkbox", name="Remember me", exact=True).check()' in source
    assert 'expect(page).to_have_url(origin + "/welcome?user=alice")' in source
    assert "page.mouse" not in source

    server.clear()
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr
    assert server.records("login") == [expected]

    # The script checks the end state: started on another page it cannot reach it and says so.
    server.clear()
    wrong = replay_script(tmp_path / "out.py", "--url", server.url + "/help.html", "--timeout", "2")
    assert wrong.returncode == 1
    assert wrong.stderr.startswith('Replay failed at step 2 (fill the "Username" textbox, line ')  # in words
    assert 'waiting for get_by_role("textbox", name="Username", exact=True)' in wrong.stderr  # Playwright's log
    assert server.records("login") == []


def test_wizard_run_with_role_button_divs_and_a_test_id(tmp_path, server):
    url = server.url + "/wizard.html"
    # Later steps are hidden until reached: measure each in the state the run will be in.
    at = measure_along(
        url,
        [
            ("measure", "#helpbtn"),
            ("click", "#helpbtn"),
            ("measure", "#fullname"),
            ("measure", "#next1"),
            ("click", "#next1"),
            ("measure", "#motto"),
            ("measure", "#next2"),
            ("click", "#next2"),
            ("measure", "#finish"),
        ],
    )
    replies = [
        click_at(at["#helpbtn"]),  # an icon button without a name: only its test id identifies it
        click_at(at["#fullname"]),
        call(action="type", text="Ada Lovelace"),
        click_at(at["#next1"]),
        click_at(at["#motto"]),
        call(action="type", text="Hello\nworld"),
        click_at(at["#next2"]),
        click_at(at["#finish"]),
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Order a sticker for Ada Lovelace saying Hello world")
    assert result.returncode == 0, result.stderr
    expected = {"name": "Ada Lovelace", "motto": "Hello\nworld"}
    assert server.records("wizard") == [expected]

    source = exported(tmp_path)
    assert 'page.get_by_test_id("help-toggle").click()' in source
    assert 'page.get_by_role("button", name="Next", exact=True).click()' in source  # a div role=button
    assert '.fill("Hello\\nworld")' in source
    assert 'expect(page.get_by_text("Order placed for Ada Lovelace", exact=True)).to_be_visible()' in source

    server.clear()
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr
    assert server.records("wizard") == [expected]


def test_button_that_moves_after_load_is_replayed_by_locator(tmp_path, server):
    url = server.url + "/moving.html"
    # The run sees the page after the late banner pushed the buttons down.
    at = element_centres(url, ["#go"], wait_for="body[data-moved]")
    before_move = element_centres(url, ["#decoy"])  # where "Unsubscribe" sits before the banner arrives
    replies = [click_at(at["#go"]), call(action="terminate", status="success")]
    result = browse(tmp_path, url, replies, "Subscribe to the digest")
    assert result.returncode == 0, result.stderr
    assert server.records("moving") == [{"choice": "subscribe"}]

    trace = read_trace(tmp_path / "trace")
    detail = trace.steps[0]["results"][0]["detail"]
    assert detail["locator"] == {"kind": "role", "role": "button", "name": "Subscribe"}
    assert detail["pixels"][0][1] > 272  # the click landed on the moved button

    source = exported(tmp_path)
    assert 'get_by_role("button", name="Subscribe", exact=True).click()' in source
    assert "page.mouse" not in source
    assert before_move["#decoy"] != at["#go"]

    server.clear()
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr
    assert server.records("moving") == [{"choice": "subscribe"}]


def test_select_and_checkboxes_become_select_option_check_and_uncheck(tmp_path, server):
    url = server.url + "/prefs.html"
    at = element_centres(url, ["#country", "label[for=ads]", "#news", "#save"])
    replies = [
        click_at(at["#country"]),
        call(action="type", text="Germany"),
        call(action="key", keys=["enter"]),
        click_at(at["label[for=ads]"]),
        click_at(at["#news"]),
        click_at(at["#save"]),  # a link
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Choose Germany, no personalised ads, send the newsletter, save")
    assert result.returncode == 0, result.stderr
    expected = {"country": "de", "news": True, "ads": False}
    assert server.records("prefs") == [expected]

    source = exported(tmp_path)
    assert 'get_by_role("combobox", name="Country", exact=True).select_option(label="Germany")' in source
    assert 'get_by_role("checkbox", name="Show personalised ads", exact=True).uncheck()' in source
    assert 'get_by_role("checkbox", name="Send me the newsletter", exact=True).check()' in source
    assert 'get_by_role("link", name="Save preferences", exact=True).click()' in source
    assert 'expect(page.get_by_role("combobox", name="Country", exact=True)).to_have_value("de")' in source
    assert "not_to_be_checked()" in source
    assert "page.keyboard" not in source

    server.clear()
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr
    assert server.records("prefs") == [expected]


def test_a_page_whose_server_dies_ends_the_run_with_a_clear_error_and_a_complete_trace(tmp_path):
    server = PageServer(die_on=("/login",)).start()
    try:
        url = server.url + "/login.html"
        at = element_centres(url, ["#username", "button"])
        replies = [
            click_at(at["#username"]),
            call(action="type", text="alice"),
            click_at(at["button"]),  # the server stops instead of answering
            click_at(at["button"]),
            call(action="terminate", status="success"),
        ]
        result = browse(tmp_path, url, replies, "Sign in as alice")
    finally:
        server.stop()
    assert result.returncode == 1
    assert "stopped answering" in result.stderr
    assert "Traceback" not in result.stderr
    assert "was not written" in result.stderr
    assert not (tmp_path / "out.py").exists()
    trace = read_trace(tmp_path / "trace")
    assert trace.damaged_lines == 0
    assert trace.end is not None and trace.end["status"] == "error"
    assert "stopped answering" in trace.end["message"]
    # The dead server is noticed while step 3's click waits for its page, or at step 4's screenshot when
    # that wait ended first (a busy machine): either way the step that noticed it is the last and says so.
    assert [s["step"] for s in trace.steps] in ([1, 2, 3], [1, 2, 3, 4])
    assert "stopped answering" in trace.steps[-1]["error"]
    for step in trace.steps:
        if step.get("screenshot"):
            assert (tmp_path / "trace" / step["screenshot"]).stat().st_size > 0


def test_a_browser_closed_mid_run_ends_it_with_a_clear_error_and_a_complete_trace(tmp_path, server):
    from tests.pages.helpers import kill_browser_below

    url = server.url + "/login.html"
    at = element_centres(url, ["#username"])
    replies = [
        click_at(at["#username"]),
        call(action="wait", time=4),  # the test closes the browser meanwhile (a /proc scan: milliseconds)
        call(action="type", text="alice"),
        call(action="terminate", status="success"),
    ]
    replay = write_replay(tmp_path / "replies.json", replies)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent), **ENV)
    env["QVL_CONFIG_DIR"] = str(tmp_path / "config")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qvl_agent",
            "browse",
            "--url",
            url,
            "--engine",
            f"replay:{replay}",
            "--trace-dir",
            str(tmp_path / "trace"),
            "Type alice",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # Once step 2 (the wait) is under way, the step-1 line is in the trace: close the browser.
        trace_file = tmp_path / "trace" / "trace.jsonl"
        for line in proc.stdout:
            if line.startswith("step 2:"):
                break
        assert kill_browser_below(proc.pid)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "The browser closed during the run." in stderr
    assert "Traceback" not in stderr
    lines = [json.loads(line) for line in trace_file.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[-1]["type"] == "end"
    assert lines[-1]["status"] == "error"
    assert "browser closed" in lines[-1]["message"]


def test_bad_usage_and_a_missing_browser_give_one_sentence(tmp_path, server):
    url = server.url + "/login.html"
    replay = write_replay(tmp_path / "r.json", [call(action="terminate", status="success")])
    base = ["browse", "--engine", f"replay:{replay}"]
    bad_url = run_cli(*base, "--url", "login.html", "Sign in", env=ENV)
    assert bad_url.returncode == 2 and "--url must start with" in bad_url.stderr
    script = run_cli("playwright", "--engine", f"replay:{replay}", "--url", "ftp://host/", "Sign in", env=ENV)
    assert script.returncode == 2 and "--url must start with" in script.stderr and "ftp://host/" in script.stderr
    bad_viewport = run_cli(*base, "--url", url, "--viewport", "big", "Sign in", env=ENV)
    assert bad_viewport.returncode == 2 and "WIDTHxHEIGHT" in bad_viewport.stderr
    no_browser = run_cli(
        *base,
        "--url",
        url,
        "--browser",
        str(tmp_path / "no-chromium"),
        "--trace-dir",
        str(tmp_path / "t"),
        "Sign in",
        env=ENV,
    )
    assert no_browser.returncode == 1
    assert "does not exist" in no_browser.stderr and "Traceback" not in no_browser.stderr
    dead_url = run_cli(*base, "--url", "http://127.0.0.1:9/", "--trace-dir", str(tmp_path / "t2"), "Go", env=ENV)
    assert dead_url.returncode == 1 and "could not be opened" in dead_url.stderr


@pytest.mark.display
def test_headed_run_with_another_viewport_on_the_virtual_display(tmp_path, server, x_display):
    url = server.url + "/moving.html"
    viewport = (1024, 700)
    at = element_centres(url, ["#go"], wait_for="body[data-moved]", viewport=viewport)
    replies = [click_at(at["#go"]), call(action="terminate", status="success")]
    result = browse(tmp_path, url, replies, "Subscribe", "--headed", "--viewport", "1024x700")
    assert result.returncode == 0, result.stderr
    assert server.records("moving") == [{"choice": "subscribe"}]
    trace = read_trace(tmp_path / "trace")
    assert trace.steps[0]["screen"]["width"] == 1024 and trace.steps[0]["screen"]["height"] == 700
    assert 'VIEWPORT = {"width": 1024, "height": 700}' in exported(tmp_path)


def test_each_step_prints_the_model_s_one_line_reason_before_its_actions(tmp_path, server):
    url = server.url + "/login.html"
    at = element_centres(url, ["#username"])
    long_reason = "The form is filled; " + "nothing else is left to do on this page, " * 6
    replies = [
        "Thought: the user name goes in the first field.\nAction: click it.\n" + click_at(at["#username"]),
        call(action="type", text="alice"),  # no words: no reason line
        long_reason + "\x1b[2J\n" + call(action="terminate", status="success"),
    ]
    done = browse(tmp_path, url, replies, "Type alice")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    first = lines.index("step 1: the model says: Thought: the user name goes in the first field.")
    assert lines[first + 1].startswith("step 1: left_click")
    assert not any(line.startswith("step 2: the model says") for line in lines)
    [third] = [line for line in lines if line.startswith("step 3: the model says: ")]
    assert third.startswith("step 3: the model says: The form is filled; nothing else") and third.endswith("…")
    assert len(third) < 200 and "\x1b" not in done.stdout


def test_a_secret_the_model_read_off_the_page_is_not_printed_in_its_reason(tmp_path, server):
    url = server.url + "/login.html"
    replies = ["The field shows 4711-ab, so the PIN is in.\n" + call(action="terminate", status="success")]
    replay = write_replay(tmp_path / "replies.json", replies)
    done = run_cli(
        "browse", "--url", url, "--engine", f"replay:{replay}", "--secret", "PIN", "--trace-dir", str(tmp_path / "t"),
        "Check the PIN", env=dict(ENV, QVL_CONFIG_DIR=str(tmp_path / "config"), QVL_SECRET_PIN="4711-ab"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step 1: the model says: The field shows {{PIN}}, so the PIN is in." in done.stdout.splitlines()
    assert "4711-ab" not in done.stdout + done.stderr
