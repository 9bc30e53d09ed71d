"""`qvl-agent replay --heal` on a site that changed: each page has an A version (where the run is recorded and
exported) and a B version served later at the same URL: a renamed button, an element moved to another
container, ids made up anew on every load, a changed label, two unnamed fields that swapped places, a
second button of the same name (a strict-mode violation), and a cookie banner that covers the page the
first time.

For each: the script exported on A fails on B with plain `python` and with `qvl-agent replay`; with
`replay --heal` and a grounding oracle (an OpenAI-compatible server that answers from a separate look at
the page's DOM, in Qwen3-VL's format) it reaches the recorded end state on B (the page posts what it
posted on A), lists every heal, writes SCRIPT.healed.py and a report; the healed script then replays on B
with plain `python`, no model. A wrong answer (an element of another role, or no element at all) stops
the replay with one sentence before the step acts, and writes no healed script."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.pages.helpers import ENV, browse, call, click_at, exported, measure_along, replay_script
from tests.pages.server import PageServer
from tests.support.heal_oracle import DomGroundingOracle, start

pytestmark = [pytest.mark.browser]

DONE = call(action="terminate", status="success")


def typed(text: str) -> str:
    return call(action="type", text=text)


@dataclass
class Case:
    page: str
    plan: list[tuple]  # what to measure on A
    replies: Callable[[dict], list[str]]  # the recorded run on A
    expected: dict  # what the page posts at the end
    targets: dict[str, str]  # for the oracle on B: a phrase of the question -> the element it means
    new_code: list[str]  # what the healed script says
    heals: int  # steps healed (not counting reuses)
    asks: int = 0  # the model's turns, when not one per heal


CASES = [
    Case(
        "renamed",
        [("measure", "#name"), ("measure", "#go")],
        lambda at: [click_at(at["#name"]), typed("Ada"), click_at(at["#go"]), DONE],
        {"name": "Ada"},
        {'the "Sign up" button': "#go"},
        ['page.get_by_role("button", name="Create account", exact=True).click()'],
        1,
    ),
    Case(
        "moved",
        [("measure", ".row:nth-of-type(2) .star")],
        lambda at: [click_at(at[".row:nth-of-type(2) .star"]), DONE],
        {"starred": "beta"},
        {'in the item that says "Beta"': "li:nth-of-type(2) .star"},
        ['page.locator("li.project").filter(has=page.get_by_text("Beta", exact=True)).get_by_text("☆", exact=True)'],
        1,
    ),
    Case(
        "ids",
        [("measure", "#qty"), ("measure", "#place")],
        lambda at: [click_at(at["#qty"]), typed("3"), click_at(at["#place"]), DONE],
        {"qty": "3"},
        {'the number field after "Quantity"': "input"},
        [
            'page.locator("body > div > input").fill("3")',
            'expect(page.locator("body > div > input")).to_have_value("3")',
        ],
        1,
    ),
    Case(
        "label",
        [("measure", "#mail"), ("measure", "#sub")],
        lambda at: [click_at(at["#mail"]), typed("ada@example.org"), click_at(at["#sub"]), DONE],
        {"email": "ada@example.org"},
        {'the "Email" text field': "#mail"},
        ['page.get_by_role("textbox", name="Your e-mail address", exact=True).fill("ada@example.org")'],
        1,
    ),
    Case(
        "swapped",
        [("measure", "[name=from]"), ("measure", "[name=to]"), ("measure", "#search")],
        lambda at: [
            click_at(at["[name=from]"]),
            typed("Oslo"),
            click_at(at["[name=to]"]),
            typed("Rome"),
            click_at(at["#search"]),
            DONE,
        ],
        {"from": "Oslo", "to": "Rome"},
        {'after "From"': "[name=from]", 'after "To"': "[name=to]"},
        [
            'page.locator("body > form > p:nth-of-type(4) > input").fill("Oslo")',
            'page.locator("body > form > p:nth-of-type(2) > input").fill("Rome")',
        ],
        2,
    ),
    Case(
        "twice",
        [("measure", "button[data-d=old]")],
        lambda at: [click_at(at["button[data-d=old]"]), DONE],
        {"deleted": "old"},
        {'the "Delete" button after "Old draft"': "button[data-d=old]"},  # two "Delete" buttons now
        [
            'page.locator("div.row").filter(has=page.get_by_text("Old draft", exact=True))'
            '.get_by_role("button", name="Delete", exact=True).click()'
        ],
        1,
    ),
    Case(
        "cookie",
        [("measure", "#code"), ("measure", "#redeem")],
        lambda at: [click_at(at["#code"]), typed("SPRING"), click_at(at["#redeem"]), DONE],
        {"code": "SPRING"},
        {"covering the page": "#ok"},
        [
            'page.add_locator_handler(page.get_by_role("button", name="Accept all", exact=True), '
            "lambda found: found.click())"
        ],
        1,
    ),
    Case(
        "both",  # the banner, and behind it the button renamed: two heals on one step
        [("measure", "#code"), ("measure", "#redeem")],
        lambda at: [click_at(at["#code"]), typed("SPRING"), click_at(at["#redeem"]), DONE],
        {"code": "SPRING"},
        {"covering the page": "#ok", 'the "Redeem" button': "#redeem"},
        [
            'page.add_locator_handler(page.get_by_role("button", name="Accept all", exact=True), '
            "lambda found: found.click())",
            'page.get_by_role("button", name="Use code", exact=True).click()',
        ],
        2,
        asks=3,  # the button is found under the banner; the banner is closed; the button is found again
    ),
]


@pytest.fixture(scope="session")  # as long as record_on_a, whose scripts name its port
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def _record(folder: Path, server: PageServer, case: Case) -> str:
    """Record and export the run on version A into `folder`; returns the page's URL."""
    server.site = "a"
    url = f"{server.url}/site/{case.page}.html"
    at = measure_along(url, case.plan)
    server.clear()
    result = browse(folder, url, case.replies(at), f"the {case.page} task")
    assert result.returncode == 0, result.stderr
    assert server.records(case.page) == [case.expected], "the run itself did not reach the end state on A"
    exported(folder)
    return url


@pytest.fixture(scope="session")
def record_on_a(server, tmp_path_factory):
    """`record_on_a(tmp_path, case)`: the script exported from the run on version A, as tmp_path/out.py;
    returns the page's URL, with the server on version A. Each page's run is recorded once per session (a
    browse and its browser cost more than any one replay of the script) and copied into each test's own
    folder, where a replay writes beside it. Session-scoped, not module-scoped: pytest tears a module's
    fixtures down whenever a worker turns to another module, and tests/conftest.py deals this module's slow
    tests out among the others."""
    scripts: dict[str, tuple[str, Path]] = {}

    def record(tmp_path: Path, case: Case) -> str:
        if case.page not in scripts:
            folder = tmp_path_factory.mktemp(f"a-{case.page}")
            scripts[case.page] = (_record(folder, server, case), folder / "out.py")
        url, script = scripts[case.page]
        shutil.copy2(script, tmp_path / "out.py")
        server.site = "a"
        return url

    return record


def replay(*args: str, tmp_path):
    env = dict(ENV, QVL_CONFIG_DIR=str(tmp_path / "config"))
    return run_cli("replay", *args, env=env, timeout=300)


def healing(tmp_path, engine: str, script):
    """`replay --heal` with steps that wait 3 s: a broken step is probed that long (not 5 s) before it is healed."""
    return replay(
        "--heal", "--engine", engine, "--trace-dir", str(tmp_path / "heals"), "--step-timeout", "3", str(script),
        tmp_path=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.page for c in CASES])
@pytest.mark.slow
def test_a_script_from_the_old_page_heals_on_the_new_one(tmp_path, server, record_on_a, case):
    url = record_on_a(tmp_path, case)
    script = tmp_path / "out.py"
    original = script.read_text()
    server.site = "b"

    server.clear()
    plain = replay_script(script, "--timeout", "2")  # a failing step waits this long
    assert plain.returncode == 1, plain.stdout + plain.stderr
    assert server.records(case.page) != [case.expected]

    server.clear()
    sandboxed = replay(str(script), "--step-timeout", "2", "-o", str(tmp_path / "plain.out"), tmp_path=tmp_path)
    assert sandboxed.returncode == 1, sandboxed.stdout + sandboxed.stderr
    assert "30000ms" not in sandboxed.stderr + sandboxed.stdout  # a step waits --step-timeout, not the script's 30 s
    assert server.records(case.page) != [case.expected]

    oracle = DomGroundingOracle(url, case.targets)
    engine, httpd = start(oracle)
    try:
        server.clear()
        healed = healing(tmp_path, engine, script)
    finally:
        httpd.shutdown()
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert oracle.problems == []
    assert len(oracle.requests) == (case.asks or case.heals)  # one turn per heal; a reused heal asks nothing
    assert server.records(case.page) == [case.expected]  # the recorded end state, on B
    listed = re.findall(r"^qvl-agent: healed step \d+", healed.stderr, re.M)
    assert len(listed) >= case.heals, healed.stderr
    healed_path = tmp_path / "out.healed.py"
    assert f"wrote {healed_path}" in healed.stderr
    source = healed_path.read_text()
    for code in case.new_code:
        assert code in source
        assert "+    " + code in healed.stdout  # the diff, printed
    assert script.read_text() == original  # the person's script is left as it was
    report = (tmp_path / "heals" / "report.html").read_text()
    assert report.count('class="heal"') == case.heals
    for step in re.findall(r"^qvl-agent: healed step (\d+)", healed.stderr, re.M):
        assert f"<h2>Script step {step}<" in report  # numbered as the script numbers its steps
    if case.page == "renamed":  # the step's intent says what its element is now: a second heal asks for that
        [intent] = [line for line in source.splitlines() if '"action": "click", "role": "button"' in line]
        assert '"name": "Create account"' in intent and "Sign up" not in intent

    server.clear()
    again = replay_script(healed_path, "--timeout", "3")  # plain python, no model, no hook
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.records(case.page) == [case.expected]


def test_a_heal_onto_an_element_of_another_role_stops_the_replay(tmp_path, server, record_on_a):
    case = CASES[0]
    url = record_on_a(tmp_path, case)
    server.site = "b"
    oracle = DomGroundingOracle(url, {'the "Sign up" button': "#name"})  # the name field, not the button
    engine, httpd = start(oracle)
    try:
        server.clear()
        result = healing(tmp_path, engine, tmp_path / "out.py")
    finally:
        httpd.shutdown()
    assert result.returncode == 1
    assert 'Step 3 (the "Sign up" button) was not healed: the model pointed at (' in result.stderr
    assert "and that is a textbox, not a button; the replay stops here rather than guess." in result.stderr
    assert "qvl-agent: healed" not in result.stderr
    assert server.records(case.page) == []  # the wrong element was never clicked: nothing was submitted
    assert not (tmp_path / "out.healed.py").exists()
    report = (tmp_path / "heals" / "report.html").read_text()
    assert "not healed" in report


def test_a_point_on_no_element_stops_the_replay(tmp_path, server, record_on_a):
    case = CASES[3]
    url = record_on_a(tmp_path, case)
    server.site = "b"
    oracle = DomGroundingOracle(url, {'the "Email" text field': [990, 990]})  # the bare page
    engine, httpd = start(oracle)
    try:
        server.clear()
        result = healing(tmp_path, engine, tmp_path / "out.py")
    finally:
        httpd.shutdown()
    assert result.returncode == 1
    assert 'Step 2 (the "Email" text field) was not healed' in result.stderr
    assert "there is no element there that a locator can name" in result.stderr
    assert server.records(case.page) == []
    assert not (tmp_path / "out.healed.py").exists()


def test_a_script_that_needs_no_healing_asks_nothing(tmp_path, server, record_on_a):
    case = CASES[0]
    url = record_on_a(tmp_path, case)
    oracle = DomGroundingOracle(url, case.targets)  # still version A
    engine, httpd = start(oracle)
    try:
        server.clear()
        result = healing(tmp_path, engine, tmp_path / "out.py")
    finally:
        httpd.shutdown()
    assert result.returncode == 0, result.stderr
    assert oracle.requests == []
    assert "no step needed healing" in result.stderr
    assert server.records(case.page) == [case.expected]
    assert not (tmp_path / "out.healed.py").exists()


def test_heal_with_the_replay_engine(tmp_path, server, record_on_a):
    """`--heal` takes any engine: here recorded replies (`replay:FILE`), the grounding answer first."""
    case = CASES[1]
    record_on_a(tmp_path, case)
    server.site = "b"
    at = measure_along(f"{server.url}/site/moved.html", [("measure", "li:nth-of-type(2) .star")])
    replies = tmp_path / "heal-replies.json"
    replies.write_text('["' + click_at(at["li:nth-of-type(2) .star"]).replace('"', '\\"').replace("\n", "\\n") + '"]')
    server.clear()
    result = healing(tmp_path, f"replay:{replies}", tmp_path / "out.py")
    assert result.returncode == 0, result.stderr
    assert server.records("moved") == [case.expected]
    assert (tmp_path / "out.healed.py").exists()


@pytest.mark.slow
def test_the_mcp_replay_tool_heals_on_request(tmp_path, server, record_on_a):
    """The MCP `replay` tool runs a script's text in the sandbox; with heal=true it comes back healed. As
    `browse`, it refuses a script for a local address unless the server was started with --allow-local-urls."""
    from qvl_agent.config import Settings
    from qvl_agent.engine.replay import ReplayEngine
    from qvl_agent.errors import UsageError
    from qvl_agent.mcp_server.tools import ScreenTools
    from tests.pages.helpers import CHROMIUM

    case = CASES[0]
    record_on_a(tmp_path, case)
    recorded = (tmp_path / "out.py").read_text()
    # Each step waits 3 s, not the script's 30: the replay without heal fails on its broken step.
    script = recorded.replace('"--timeout", type=float, default=30,', '"--timeout", type=float, default=3,')
    assert script != recorded
    server.site = "b"
    at = measure_along(f"{server.url}/site/renamed.html", [("measure", "#go")])
    engine = ReplayEngine([click_at(at["#go"])])
    guarded = ScreenTools(engine, Settings(), browser=CHROMIUM)
    server.clear()
    with pytest.raises(UsageError, match="does not reach the local address 127.0.0.1 on this server"):
        guarded.replay(script, heal=True)  # a script made for this machine's own services, from a caller
    assert server.records("renamed") == [] and engine.position == 0
    tools = ScreenTools(engine, Settings(), browser=CHROMIUM, allow_local_urls=True)

    server.clear()
    plain = tools.replay(script, timeout_s=120)
    assert plain["exit_status"] == 1 and plain["heals"] == [] and plain["healed_script"] == ""
    assert engine.position == 0  # without heal the model is never asked

    server.clear()
    healed = tools.replay(script, heal=True, timeout_s=120)
    assert healed["exit_status"] == 0, healed
    assert server.records("renamed") == [case.expected]
    [heal] = healed["heals"]
    assert heal["failing"] == 'page.get_by_role("button", name="Sign up", exact=True)'
    assert heal["locator"] == 'page.get_by_role("button", name="Create account", exact=True)'
    assert 'page.get_by_role("button", name="Create account", exact=True).click()' in healed["healed_script"]
    assert healed["report"].endswith("report.html")
    # The heals' run sits inside the MCP run's folder, and `trace list` still lists it, with where it is.
    heals = Path(healed["report"]).parent
    listed = run_cli("trace", "list", "-n", "100").stdout
    assert f"{heals.resolve()} " in listed, listed


def test_an_earlier_healed_script_is_never_overwritten(tmp_path, server, record_on_a):
    case = CASES[0]
    url = record_on_a(tmp_path, case)
    earlier = tmp_path / "out.healed.py"
    earlier.write_text("# my own edits\n")
    server.site = "b"
    oracle = DomGroundingOracle(url, case.targets)
    engine, httpd = start(oracle)
    try:
        result = healing(tmp_path, engine, tmp_path / "out.py")
    finally:
        httpd.shutdown()
    assert result.returncode == 0, result.stderr
    assert earlier.read_text() == "# my own edits\n"
    assert f"wrote {tmp_path / 'out.healed-2.py'}" in result.stderr
    assert (tmp_path / "out.healed-2.py").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "args, says",
    [
        (["--trace-dir", "x"], "--trace-dir only goes with --heal."),
        (["--heal", "--engine", "bogus"], "Unknown engine 'bogus'"),
    ],
)
def test_bad_heal_usage_is_one_sentence_and_exit_2(tmp_path, args, says):
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    result = replay(*args, str(script), tmp_path=tmp_path)
    assert result.returncode == 2
    assert says in result.stderr and "Traceback" not in result.stderr
