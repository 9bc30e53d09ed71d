"""Secrets never land on disk: the model writes {{NAME}}, the browser gets the value, and no file of the run,
no line of output and no exported script holds it. Run folders are private. --allow-domain blocks and
reports navigation to other hosts. Real Chromium, a real form on 127.0.0.1, a replayed model."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from qvl_agent import actions as A
from qvl_agent.errors import ActionError, UsageError
from qvl_agent.playwright.chromium import find_browser
from qvl_agent.scripts.literals import UnsafeValue, lit, typed_code
from qvl_agent.secrets import Secrets, read_secrets
from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.pages.helpers import call, click_at, element_centres, write_replay
from tests.pages.server import PageServer


@pytest.fixture
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def test_placeholders_are_revealed_for_the_executor_and_values_masked_everywhere_else():
    secrets = Secrets({"PASSWORD": "hunter2", "USER": "grace"})
    typed = secrets.reveal_action(A.Type("{{USER}}:{{PASSWORD}}"))
    assert typed == A.Type("grace:hunter2")
    assert secrets.reveal_action(A.Type("plain")) == A.Type("plain")
    assert secrets.mask({"message": "type 'grace:hunter2'", "after": ["hunter2", 3]}) == {
        "message": "type '{{USER}}:{{PASSWORD}}'",
        "after": ["{{PASSWORD}}", 3],
    }
    with pytest.raises(ActionError, match=r"no secret \{\{TOKEN\}\}; the secrets you can type are"):
        secrets.reveal("{{TOKEN}}")


def test_values_come_from_the_environment_or_a_prompt_and_a_missing_one_is_one_sentence():
    assert read_secrets(["PASSWORD"], {"QVL_SECRET_PASSWORD": "x1"}).values == {"PASSWORD": "x1"}
    asked = read_secrets(["PIN"], {}, ask=lambda prompt: "1234" if "PIN" in prompt else "")
    assert asked.values == {"PIN": "1234"}
    with pytest.raises(UsageError, match="set the environment variable QVL_SECRET_PIN"):
        read_secrets(["PIN"], {})
    with pytest.raises(UsageError, match="letters, digits and _"):
        read_secrets(["my-pin"], {"QVL_SECRET_my-pin": "1"})


def test_only_a_typed_placeholder_of_a_declared_secret_reads_the_environment():
    # Any recorded text is text, braces and all: a label, a page's value, a word the model typed.
    assert lit("{{PASSWORD}}") == '"{{PASSWORD}}"' and lit("id {{USER}}!") == '"id {{USER}}!"'
    declared = Secrets({"PASSWORD": "x", "USER": "y"})
    assert typed_code(declared.segments("{{PASSWORD}}")) == 'os.environ["QVL_SECRET_PASSWORD"]'
    assert typed_code(declared.segments("id {{USER}}!")) == '("id " + os.environ["QVL_SECRET_USER"] + "!")'
    # A placeholder the run did not declare stays the text the model typed.
    assert typed_code(Secrets({}).segments("{{PASSWORD}}")) == '"{{PASSWORD}}"'
    assert typed_code(declared.segments("{{HOME}} {{PASSWORD}}")) == '("{{HOME}} " + os.environ["QVL_SECRET_PASSWORD"])'
    # The record is structure, never searched: a value equal to the secret is not a secret read.
    assert typed_code(Secrets({"PASSWORD": "demo"}).segments("demo")) == '"demo"'
    with pytest.raises(UnsafeValue):
        typed_code([["secret", 'X"]; import os; os.system("id"); ["']])


def _replay_plainly(script, tmp_path, *args, **secrets):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("QVL_SECRET_")}
    env.update(QVL_BROWSER=find_browser(), **secrets)
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )


def _sign_in(tmp_path, server, user: str, password: str, *args: str, env=None):
    """`browse` the login page with a model that types `user` and `password` into its fields and signs in."""
    url = server.url + "/login.html"
    at = element_centres(url, ["#username", "#password", "button"])
    replies = [
        click_at(at["#username"]), call(action="type", text=user),
        click_at(at["#password"]), call(action="type", text=password),
        click_at(at["button"]), call(action="terminate", status="success"),
    ]  # fmt: skip
    return _browse(tmp_path, url, replies, *args, env=env)


@pytest.mark.slow
def test_a_user_name_equal_to_the_password_is_exported_as_the_user_name(tmp_path, server):
    """README's demo/demo login: the model types `demo` as the user name and {{PASSWORD}} (also "demo")
    as the password. The export reads the secret in the password field alone: replayed with another
    password, the user name is still demo."""
    script = tmp_path / "login.py"
    result = _sign_in(tmp_path, server, "demo", "{{PASSWORD}}", "--secret", "PASSWORD", "--export", str(script),
                      env={"QVL_SECRET_PASSWORD": "demo"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert server.records("login") == [{"username": "demo", "password": "demo"}]
    source = script.read_text()
    assert source.count('.fill("demo")') == 1  # the user name, as the model typed it
    assert source.count('.fill(os.environ["QVL_SECRET_PASSWORD"])') == 1  # the secret, where it typed {{PASSWORD}}
    assert source.count('os.environ["QVL_SECRET_PASSWORD"]') == 1
    assert 'SECRETS = ["QVL_SECRET_PASSWORD"]' in source  # asked for before the browser starts
    server.clear()
    # Another password signs in as someone else: the recorded end state is not reached, and its checks
    # give up after --timeout rather than the script's 30 s. What the page was sent is the point here.
    _replay_plainly(script, tmp_path, "--timeout", "5", QVL_SECRET_PASSWORD="other-" + uuid.uuid4().hex[:6])
    [record] = server.records("login")  # what the replay typed, read by the page
    assert record["username"] == "demo" and record["password"].startswith("other-")

    # Without the variable: one sentence naming it, before any browser starts, plainly and through replay.
    server.clear()
    plain = _replay_plainly(script, tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert "This script types a secret from $QVL_SECRET_PASSWORD, which is not set" in plain.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("QVL_SECRET_")}
    sandboxed = run_cli("replay", str(script), env=dict(env, QVL_CONFIG_DIR=str(tmp_path / "config")))
    assert sandboxed.returncode == 2 and "Traceback" not in sandboxed.stderr
    assert "The script types a secret from $QVL_SECRET_PASSWORD, which is not set" in sandboxed.stderr
    assert "qvl-agent: network:" not in sandboxed.stderr  # stopped before it was given anything
    assert server.records("login") == []


def test_a_placeholder_the_run_did_not_declare_stays_text_and_reads_no_variable(tmp_path, server):
    """Without --secret, `{{PASSWORD}}` typed by the model (say, because the page asked for it) is text:
    the export types those characters, and a replay hands the page no variable of the person's."""
    script = tmp_path / "asked.py"
    result = _sign_in(tmp_path, server, "{{PASSWORD}}", "x {{HOME}}", "--export", str(script))
    assert result.returncode == 0, result.stderr
    source = script.read_text()
    assert "QVL_SECRET" not in source and "os.environ[" not in source
    server.clear()
    person = "person-" + uuid.uuid4().hex
    replayed = _replay_plainly(script, tmp_path, QVL_SECRET_PASSWORD=person, QVL_SECRET_HOME=person)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert server.records("login") == [{"username": "{{PASSWORD}}", "password": "x {{HOME}}"}]


def _browse(tmp_path, url, replies, *extra, env=None):
    replay = write_replay(tmp_path / "replies.json", replies)
    return run_cli(
        "browse", "--url", url, "--engine", f"replay:{replay}", "--trace-dir", str(tmp_path / "run"), *extra,
        "Sign in", env={"QVL_CONFIG_DIR": str(tmp_path / "config"), **(env or {})}, timeout=180,
    )  # fmt: skip


def test_a_password_typed_into_a_real_form_never_lands_in_any_file_of_the_run(tmp_path, server):
    password = "pw-" + uuid.uuid4().hex
    url = server.url + "/login.html"
    at = element_centres(url, ["#username", "#password", "button"])
    replies = [
        click_at(at["#username"]),
        call(action="type", text="grace"),
        click_at(at["#password"]),
        call(action="type", text="{{PASSWORD}}"),
        click_at(at["button"]),
        call(action="terminate", status="success"),
    ]
    script = tmp_path / "signin.py"
    result = _browse(
        tmp_path, url, replies, "--secret", "PASSWORD", "--export", str(script),
        env={"QVL_SECRET_PASSWORD": password},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert server.records("login") == [{"username": "grace", "password": password}]  # the value was typed

    run_dir = tmp_path / "run"
    files = [p for p in run_dir.rglob("*") if p.is_file()] + [script]
    assert len(files) >= 5  # trace, screenshots, browser info, the script
    for path in files:
        assert password.encode() not in path.read_bytes(), path
    assert password not in result.stdout and password not in result.stderr
    assert "{{PASSWORD}}" in (run_dir / "trace.jsonl").read_text()
    assert 'os.environ["QVL_SECRET_PASSWORD"]' in script.read_text()
    # The model was told the placeholder, never the value.
    first = read_trace(run_dir).steps[0]["observation"]
    assert "{{PASSWORD}}" in first and password not in first

    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in run_dir.iterdir())
    assert stat.S_IMODE(script.stat().st_mode) & 0o077 == 0

    # The exported script types the secret from the environment when replayed.
    server.clear()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(QVL_SECRET_PASSWORD=password, QVL_BROWSER=find_browser())
    replayed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert replayed.returncode == 0, replayed.stderr
    assert server.records("login") == [{"username": "grace", "password": password}]


def test_a_secret_without_a_value_stops_before_anything_runs(tmp_path, server):
    result = _browse(tmp_path, server.url + "/login.html", [call(action="terminate", status="success")],
                     "--secret", "PASSWORD")  # fmt: skip
    assert result.returncode == 2
    assert "QVL_SECRET_PASSWORD" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_navigation_off_the_allowed_domains_is_blocked_and_told_to_the_model(tmp_path, server):
    url = server.url + "/away.html"
    at = element_centres(url, ["#away", "#home"])
    replies = [
        click_at(at["#away"]),  # http://localhost:PORT/help.html: the same server, another host name
        click_at(at["#home"]),  # /help.html on 127.0.0.1: allowed
        call(action="terminate", status="success"),
    ]
    result = _browse(tmp_path, url, replies, "--allow-domain", "example.org")
    assert result.returncode == 0, result.stderr
    steps = read_trace(tmp_path / "run").steps
    assert "localhost, which is not an allowed domain: that was blocked" in steps[0]["results"][0]["message"]
    assert "not an allowed domain" in steps[1]["observation"]  # what the model read next
    assert steps[1]["results"][0]["detail"]["url"].startswith(server.url + "/away.html")  # it stayed
    assert "not an allowed domain" not in steps[1]["results"][0]["message"]
    assert read_trace(tmp_path / "run").steps[-1]["screenshot"]
    assert Path(tmp_path / "run" / "browser.json").exists()


def test_a_redirect_from_an_allowed_page_to_another_host_is_blocked_too(tmp_path, server):
    url = server.url + "/away.html"
    at = element_centres(url, ["#bounce"])
    replies = [click_at(at["#bounce"]), click_at(at["#bounce"]), call(action="terminate", status="success")]
    result = _browse(tmp_path, url, replies, "--allow-domain", "example.org")
    assert result.returncode == 0, result.stderr
    steps = read_trace(tmp_path / "run").steps
    assert "localhost, which is not an allowed domain: that was blocked" in steps[0]["results"][0]["message"]
    assert "not an allowed domain" in steps[1]["observation"]  # what the model read next
    assert steps[1]["results"][0]["detail"]["url"] == url  # back where it was, not on localhost


@pytest.fixture
def form(x_display, tmp_path):
    from tests.test_desktop_e2e import FormApp

    app = FormApp(tmp_path)
    yield app
    app.close()


def test_on_the_desktop_the_secret_is_typed_into_the_real_window_and_kept_out_of_the_run(form, tmp_path):
    secret = "pin-" + uuid.uuid4().hex[:12]
    replies = [
        call(action="left_click", coordinate=form.center("name")) + call(action="type", text="{{PIN}}"),
        call(action="terminate", status="success"),
    ]
    replay = write_replay(tmp_path / "replies.json", replies)
    run_dir = tmp_path / "run"
    result = run_cli(
        "run", "--engine", f"replay:{replay}", "--yes", "--secret", "PIN", "--trace-dir", str(run_dir), "Enter the PIN",
        env={"QVL_SECRET_PIN": secret, "QVL_CONFIG_DIR": str(tmp_path / "config")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert form.wait_state(lambda s: s["name"] == secret)["name"] == secret  # the value reached the window
    assert secret not in result.stdout + result.stderr
    for path in run_dir.iterdir():
        assert secret.encode() not in path.read_bytes(), path
    assert "{{PIN}}" in (run_dir / "trace.jsonl").read_text()
