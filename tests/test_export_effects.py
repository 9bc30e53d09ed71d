"""What an exported script replays, and how it waits: only what had effect in the run (a click whose
navigation `--allow-domain` blocked is left out), with the run's own step numbers in its comments, and a
tab that closes itself awaited by its close event, so that a slow or loaded machine replays it as well as an
idle one (the portal run replayed several times in a CPU-throttled Chromium)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from qvl_agent.scripts.export.exporter import compile_run, export_trace, write_browser_info
from qvl_agent.scripts.write.policy import check_script
from qvl_agent.trace import TraceWriter
from tests.pages.helpers import (
    CHROMIUM,
    browse,
    call,
    click_at,
    element_centres,
    exported,
    measure_along,
    replay_script,
)
from tests.pages.server import PageServer

URL = "http://127.0.0.1:8000/form.html"
LINK = {"kind": "role", "role": "link", "name": "Survey"}
NAME = {"kind": "role", "role": "textbox", "name": "Name"}
SEND = {"kind": "role", "role": "button", "name": "Send"}
GO = {"kind": "role", "role": "button", "name": "Go"}
SURVEY = "http://127.0.0.1:8000/survey.html"


def step(kind, locator=None, before=None, after=None, url=URL, **extra):
    detail = {"url": url, **extra}
    if locator is not None:
        detail.update(locator=locator, before=before, after=after)
    return {"kind": kind, "ok": True, "detail": detail, "describe": kind}


def replay_body(source: str) -> list[str]:
    start, end = source.index("def replay(page, origin):"), source.index("def main():")
    return [line[4:] for line in source[start:end].splitlines()[1:] if line.strip()]


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


# --- only what had effect ------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.parametrize("link", ["#away", "#away-tab"], ids=["same-tab", "new-tab"])
def test_a_click_whose_navigation_was_blocked_is_not_exported_and_the_script_replays(tmp_path, server, link):
    url = server.url + "/away.html"
    at = element_centres(url, [link, "#home"])
    replies = [
        click_at(at[link]),  # to http://localhost:PORT/help.html (in this tab or a new one): another host, blocked
        click_at(at["#home"]),  # /help.html on this host: allowed
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Open the help page", "--allow-domain", "example.org")
    assert result.returncode == 0, result.stderr
    source = exported(tmp_path)
    code = "\n".join(line for line in replay_body(source) if not line.lstrip().startswith("#"))
    assert "other host name" not in code and "expect_popup" not in code and "tabs" not in code
    assert "# step 1: left_click at" in source and "not replayed: the run blocked its navigation to localhost" in source
    assert 'page.get_by_role("link", name="Help on this site", exact=True).click()' in source
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source
    assert "Replayed: the page reached the recorded end state." in replayed.stdout


def test_comments_carry_the_run_s_step_numbers(tmp_path):
    """A step with two actions and a step whose reply could not be parsed: the script's comments still name
    the steps the trace and the report name."""
    go = step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[1, 1]])["detail"]
    trace = TraceWriter(tmp_path / "run")
    trace.start(task="Press Go twice", engine="replay", executor="browser")
    trace.step(
        {
            "step": 1,
            "actions": [{"action": "left_click", "coordinate": [1, 1]}, {"action": "key", "keys": ["Tab"]}],
            "results": [
                {"action": "left_click at (1, 1)", "ok": True, "message": "done", "detail": go},
                {"action": "key Tab", "ok": True, "message": "done", "detail": {"url": URL}},
            ],
        }
    )
    trace.step({"step": 2, "reply": "I think I should", "error": "no tool call", "actions": [], "results": []})
    trace.step(
        {
            "step": 3,
            "actions": [{"action": "left_click", "coordinate": [1, 1]}],
            "results": [{"action": "left_click at (1, 1)", "ok": True, "message": "done", "detail": go}],
        }
    )
    trace.end(status="success")
    trace.close()
    write_browser_info(tmp_path / "run", URL, (800, 600), {"url": URL, "fields": [], "new_text": []})
    source = export_trace(tmp_path / "run", tmp_path / "out.py").source
    comments = [line.strip() for line in replay_body(source) if line.strip().startswith("# step")]
    assert comments == ["# step 1: left_click at (1, 1)", "# step 1: key Tab", "# step 3: left_click at (1, 1)"]


@pytest.mark.browser
def test_typing_waits_for_the_element_the_run_typed_into_to_have_the_focus(tmp_path, server):
    """The pad takes the keyboard 0.6 s after its button is pressed; the run waited, the replay has no fixed
    sleeps: it must wait for the pad to have the focus before it types, or the keys go nowhere."""
    url = f"{server.url}/keypad.html"
    save_once_open = (  # where Save is once the pad has opened above it
        "async () => { await new Promise(done => setTimeout(done, 1000));"
        " const r = document.querySelector('#save').getBoundingClientRect();"
        " return [r.x + r.width / 2, r.y + r.height / 2]; }"
    )
    at = measure_along(url, [("measure", "#open"), ("click", "#open"), ("point", "#save", save_once_open)])
    replies = [
        click_at(at["#open"]),
        call(action="wait", time=1),
        call(action="type", text="hello"),
        click_at(at["#save"]),
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Type hello on the pad and save it")
    assert result.returncode == 0, result.stderr
    assert server.records("pad") == [{"text": "hello"}], "the run itself did not type into the pad"
    source = exported(tmp_path)
    assert 'expect(page.get_by_role("log", name="Pad", exact=True)).to_be_focused()' in source
    server.clear()
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source
    assert server.records("pad") == [{"text": "hello"}]


# --- a tab that closes itself ------------------------------------------------------------------------------


def test_the_last_action_in_a_tab_that_closes_itself_waits_for_its_close_event():
    steps = [
        step("left_click", LINK, {"tag": "a"}, {"tag": "a"}, pixels=[[1, 1]]),
        step("type", NAME, {"tag": "input", "type": "", "value": ""}, None, url=SURVEY, tab=1, text="Ada"),
        step("left_click", SEND, {"tag": "button"}, None, url=SURVEY, tab=1, pixels=[[2, 2]]),
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[3, 3]]),  # back in the first tab
    ]
    source = compile_run(URL, steps, {"url": URL, "fields": [], "new_text": []}).source
    check_script(source)
    body = replay_body(source)
    send = 'page.get_by_role("button", name="Send", exact=True).click()'
    at = body.index(f"        {send}")
    assert body[at - 3 : at + 5] == [
        "closing = page",
        "try:",
        '    with closing.expect_event("close"):',
        f"        {send}",
        "except Error:",
        "    if not closing.is_closed():",
        "        raise",
        "# step 4: left_click (back to an earlier tab)",
    ]
    assert body[at + 5 : at + 7] == ["page = tabs[0]", "page.bring_to_front()"]


def _load(path):
    spec = importlib.util.spec_from_file_location("exported_portal", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.browser
@pytest.mark.slow
def test_the_portal_export_replays_in_a_cpu_throttled_browser_every_time(tmp_path, server):
    from playwright.sync_api import expect, sync_playwright

    url = f"{server.url}/portal.html"
    plan = [("measure", "#go"), ("goto", f"{server.url}/survey.html"), ("measure", "#name"), ("measure", "#send"),
            ("goto", url), ("measure", "#finish")]  # fmt: skip
    at = measure_along(url, plan)
    replies = [
        click_at(at["#go"]),  # opens the survey in a tab of its own
        click_at(at["#name"]),
        call(action="type", text="Ada"),
        click_at(at["#send"]),  # the survey sends its answer to the portal and closes itself
        click_at(at["#finish"]),
        call(action="terminate", status="success"),
    ]
    result = browse(tmp_path, url, replies, "Answer the survey as Ada, then finish")
    assert result.returncode == 0, result.stderr
    exported(tmp_path)
    script = _load(tmp_path / "out.py")
    server.clear()
    failures = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=script.CHROMIUM_ARGS)
        try:
            for attempt in range(4):
                context = browser.new_context(viewport=script.VIEWPORT)

                def slow_down(page, context=context):  # every tab runs its scripts 8x slower than this machine
                    context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 8})

                context.on("page", slow_down)
                context.set_default_timeout(30_000)
                expect.set_options(timeout=30_000)
                page = context.new_page()
                page.goto(url)
                try:
                    script.replay(page, server.url)
                except Exception as exc:  # what the script's main() would report as "Replay failed"
                    failures.append(f"attempt {attempt}: {str(exc).splitlines()[0]}")
                context.close()
        finally:
            browser.close()
            sys.modules.pop("exported_portal", None)
    assert failures == []
    assert server.records("survey") == [{"name": "Ada"}] * 4
