"""The parts of `replay --heal` that need no browser: the intent comments exported scripts carry, the healed
script's rewrite (built as syntax, checked as syntax), the healer's side of the socket facing a hostile
sandbox, and the report of heals."""

from __future__ import annotations

import ast
import base64
import functools
import io
import json
import socket

import pytest
from PIL import Image

from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.grounding import point_or_click
from qvl_agent.report import render_report
from qvl_agent.scripts import intent
from qvl_agent.scripts.heal import service as heal
from qvl_agent.scripts.heal.rewrite import Edit, RewriteError, healed_source, unified_diff
from qvl_agent.trace import read_trace

NASTY = 'Sign\u2028up"\n); __import__("os").system("touch /tmp/pwned") #\x85\\ {{PASSWORD}} \ud800'

SCRIPT = """import re

from playwright.sync_api import expect


def replay(page, origin):
    # step 2: type 'Ada'
    # intent: {"step": 2, "action": "fill", "role": "textbox", "name": "Name"}
    page.get_by_label("Name", exact=True).fill("Ada")
    # step 3: left_click
    # intent: {"step": 3, "action": "click", "role": "button", "name": "Sign up"}
    page.get_by_role("button", name="Sign up", exact=True).click(position={"x": 3, "y": 4})
    tabs = [page]
    tabs[0].get_by_role("button", name="Sign up", exact=True).click()
    button = page.get_by_role("button", name="Sign up", exact=True)
    button.click()
    # the recorded end state
    expect(page.get_by_label("Name", exact=True)).to_have_value("Ada")  # the name "é" stays
"""


def _end(source: str, text: str) -> tuple[int, int]:
    """(line, UTF-8 column) where the first line containing `text` ends, as the hook reports a call's end."""
    for n, line in enumerate(source.split("\n"), start=1):
        if text in line:
            code = line.split("  #")[0].rstrip()
            return n, len(code.encode("utf-8"))
    raise AssertionError(text)


# --- intent comments -----------------------------------------------------------------------------------


def test_an_intent_comment_is_one_ascii_line_whatever_the_page_said():
    detail = {
        "locator": {"kind": "role", "role": "button", "name": NASTY},
        "element": {"tag": "button", "near": NASTY},
        "pixels": [[10.4, 20.6]],
    }
    line = intent.comment(intent.step_intent(3, "left_click", detail, reason=NASTY))
    assert line.isascii() and "\n" not in line and "\r" not in line
    tree = ast.parse(f"def replay(page):\n    {line}\n    pass\n")
    assert [type(n).__name__ for n in tree.body[0].body] == ["Pass"]  # the comment is no code
    back = intent.parse(line)
    assert back["action"] == "left_click" and back["role"] == "button" and back["point"] == [10, 21]
    assert back["locator"]["name"] == NASTY  # the recorded locator, exactly


def test_the_question_says_what_the_step_meant():
    assert intent.describe({"role": "button", "name": "Sign up"}) == 'the "Sign up" button'
    assert intent.describe({"role": "spinbutton", "near": "Quantity"}) == 'the number field after "Quantity"'
    assert intent.describe({"name": "☆", "near": "Beta", "locator": {"kind": "css"}}) == 'the "☆" element after "Beta"'
    assert intent.describe({"role": "textbox", "name": "Email", "reason": "to subscribe"}) == (
        'the "Email" text field (to subscribe)'
    )
    assert intent.reason_of('I will sign up now.\n<tool_call>{"name": "x"}</tool_call>') == "I will sign up now."
    assert intent.implicit_role({"tag": "input", "type": "number"}) == "spinbutton"


# --- the healed script ---------------------------------------------------------------------------------


def test_a_healed_locator_replaces_only_the_failing_one():
    line, col = _end(SCRIPT, ".click(position=")
    healed = healed_source(SCRIPT, [Edit(line, col, "click", {"kind": "role", "role": "button", "name": "Create"})])
    diff = unified_diff(SCRIPT, healed, "a.py", "b.py")
    removed = [d for d in diff.splitlines() if d.startswith("-") and not d.startswith("---")]
    added = [d for d in diff.splitlines() if d.startswith("+") and not d.startswith("+++")]
    assert removed == [
        '-    # intent: {"step": 3, "action": "click", "role": "button", "name": "Sign up"}',
        '-    page.get_by_role("button", name="Sign up", exact=True).click(position={"x": 3, "y": 4})',
    ]
    # the point inside the old element is dropped: the heal acted at the new element's centre; the step's
    # intent says what its element is now, so a second heal asks for "Create"
    new_intent = {
        "step": 3,
        "action": "click",
        "role": "button",
        "name": "Create",
        "locator": {"kind": "role", "role": "button", "name": "Create"},
    }
    assert added == [
        "+    " + intent.comment(new_intent),
        '+    page.get_by_role("button", name="Create", exact=True).click()',
    ]
    assert 'the name "é" stays' in healed  # other comments and text kept


def test_an_expect_and_a_tab_keep_their_own_page_expression():
    a = _end(SCRIPT, "to_have_value")
    b = _end(SCRIPT, "tabs[0].get_by_role")
    edits = [
        Edit(*a, "to_have_value", {"kind": "css", "selector": "body > input"}),
        Edit(*b, "click", {"kind": "label", "text": "New"}),
    ]
    healed = healed_source(SCRIPT, edits)
    assert 'expect(page.locator("body > input")).to_have_value("Ada")' in healed
    assert 'tabs[0].get_by_label("New", exact=True).click()' in healed


def test_a_covering_layer_gets_a_handler_before_the_blocked_statement():
    line, col = _end(SCRIPT, ".click(position=")
    cover = Edit(line, col, "click", {"kind": "role", "role": "button", "name": "Accept all"}, cover=True)
    healed = healed_source(SCRIPT, [cover, cover])
    lines = healed.split("\n")
    at = lines.index('    page.get_by_role("button", name="Sign up", exact=True).click(position={"x": 3, "y": 4})')
    assert lines[at - 1] == (
        '    page.add_locator_handler(page.get_by_role("button", name="Accept all", exact=True), '
        "lambda found: found.click())"
    )
    assert healed.count("add_locator_handler") == 1


def test_text_from_the_page_can_only_ever_be_a_string_in_the_healed_script():
    line, col = _end(SCRIPT, ".click(position=")
    for locator in (
        {"kind": "role", "role": "button", "name": NASTY},
        {"kind": "css", "selector": NASTY},
        {"kind": "text", "text": NASTY},
    ):
        healed = healed_source(SCRIPT, [Edit(line, col, "click", locator)])
        tree = ast.parse(healed)
        assert NASTY in [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "__import__" not in names and "os" not in names
        assert len(healed.split("\n")) == len(SCRIPT.split("\n"))  # no character of it broke a line


def test_a_heal_that_does_not_line_up_with_the_script_is_refused():
    line, col = _end(SCRIPT, ".click(position=")
    with pytest.raises(RewriteError, match="No call to .click"):
        healed_source(SCRIPT, [Edit(line, col - 1, "click", {"kind": "text", "text": "x"})])
    with pytest.raises(RewriteError, match="No call to .fill"):
        healed_source(SCRIPT, [Edit(line, col, "fill", {"kind": "text", "text": "x"})])
    held = _end(SCRIPT, "button.click()")
    with pytest.raises(RewriteError, match="keeps its locator in a variable"):
        healed_source(SCRIPT, [Edit(*held, "click", {"kind": "text", "text": "x"})])
    with pytest.raises(RewriteError, match="cannot be written"):
        healed_source(SCRIPT, [Edit(line, col, "click", {"kind": "point", "x": 1, "y": 2})])


# --- the healer facing the sandbox ---------------------------------------------------------------------


def _png(width: int = 320, height: int = 200) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _click(x: int, y: int) -> str:
    call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [x, y]}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


@pytest.fixture
def service(tmp_path):
    engine = ReplayEngine([_click(500, 500), _click(250, 250), _click(100, 100)])
    svc = heal.HealService(functools.partial(point_or_click, engine), tmp_path / "heal.sock").start()
    svc.engine = engine
    yield svc
    svc.stop()


class _Hook:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.reader = self.sock.makefile("rb")

    def ask(self, message) -> dict | None:
        self.sock.sendall((message if isinstance(message, bytes) else json.dumps(message).encode()) + b"\n")
        line = self.reader.readline()
        return json.loads(line) if line else None


def _question(**extra) -> dict:
    return {
        "type": "heal",
        "kind": "locate",
        "intent": {"step": 3, "role": "button", "name": "Sign up"},
        "failing": 'internal:role=button[name="Sign up"s]',
        "error": "Timeout",
        "where": {"line": 9, "end_line": 9, "end_col": 40, "method": "click"},
        "png": _png(),
        **extra,
    }


def test_the_healer_answers_in_the_screenshots_pixels_and_keeps_the_heal(service):
    hook = _Hook(service.path)
    answer = hook.ask(_question())
    assert answer == {"point": [160.0, 100.0]}  # (500, 500) on the grid of a 320x200 screenshot
    locator = {"kind": "role", "role": "button", "name": "Create account"}
    assert hook.ask({"type": "resolved", "locator": locator, "role": "button", "problem": "", "ms": 12.5}) == {
        "go": True
    }
    assert hook.ask({"type": "reused", "failing": 'internal:role=button[name="Sign up"s]', "where": {}}) == {"go": True}
    hook.sock.close()
    [first, again] = service.heals
    assert first.locator == locator and first.step == 3 and first.description == 'the "Sign up" button'
    assert again.reused and again.locator == locator
    assert service.stopped == ""


def test_the_healer_stops_on_a_found_element_that_does_not_fit(service):
    hook = _Hook(service.path)
    hook.ask(_question())
    answer = hook.ask(
        {"type": "resolved", "locator": {"kind": "label", "text": "Name"}, "problem": "that is a textbox"}
    )
    assert answer["stop"].startswith('Step 3 (the "Sign up" button) was not healed: the model pointed at (160, 100)')
    assert service.stopped == answer["stop"]


@pytest.mark.parametrize(
    "message",
    [
        {"type": "resolved", "locator": {"kind": "point", "x": 1, "y": 2}},  # no locator names it
        {"type": "resolved", "locator": {"kind": "js", "code": "alert(1)"}},
        {"type": "resolved", "locator": {"kind": "role", "role": "button", "name": "x" * 10_000}},
        {"type": "resolved", "locator": "page.evaluate('...')"},
    ],
)
def test_a_locator_of_a_shape_locate_never_makes_is_refused(service, message):
    hook = _Hook(service.path)
    hook.ask(_question())
    assert "stop" in hook.ask(message)
    assert all(h.locator is None for h in service.heals)


def test_what_the_sandbox_sends_cannot_crash_or_flood_the_healer(service, monkeypatch):
    hook = _Hook(service.path)
    assert hook.ask(b"{not json") is None  # the connection is closed, nothing else happens
    hook = _Hook(service.path)
    assert "stop" in hook.ask(_question(png="@@@"))
    hook = _Hook(service.path)
    big = base64.b64encode(_bomb()).decode("ascii")
    assert "pixels" in hook.ask(_question(png=big))["stop"]
    hook = _Hook(service.path)
    assert hook.ask({"type": "resolved", "locator": {"kind": "text", "text": "x"}}) is None  # no question asked
    monkeypatch.setattr(heal, "MAX_LINE", 1000)
    hook = _Hook(service.path)
    assert hook.ask(_question()) is None  # a line over the bound is not read
    assert service.heals == []
    assert service.engine.position == 0  # the model was never asked


def test_a_script_that_breaks_at_every_step_is_not_healed_forever(service, monkeypatch):
    monkeypatch.setattr(heal, "MAX_HEALS", 1)
    hook = _Hook(service.path)
    hook.ask(_question())
    hook.ask({"type": "resolved", "locator": {"kind": "text", "text": "x"}})
    assert "page changed too much" in hook.ask(_question())["stop"]


def _bomb() -> bytes:
    buf = io.BytesIO()
    Image.new("1", (6000, 6000)).save(buf, "PNG")  # 36 million pixels in a few kilobytes
    return buf.getvalue()


# --- the report ----------------------------------------------------------------------------------------


def test_the_report_shows_each_heal_escaped(tmp_path):
    from qvl_agent.image import load_image_bytes
    from qvl_agent.scripts.heal.replay import HealResult, _write_trace
    from qvl_agent.scripts.replay import ReplayResult
    from qvl_agent.trace import TraceWriter

    shot = load_image_bytes(base64.b64decode(_png()))
    done = heal.Heal(3, "locate", 'the "Sign up" button', "<script>alert(1)</script>", "Timeout", {"line": 9})
    done.shot, done.point, done.locator, done.model_ms, done.total_ms = (
        shot,
        (160.0, 100.0),
        {"kind": "text", "text": "Go"},
        50,
        400,
    )
    result = HealResult(ReplayResult(0, "", []), "", [done])
    trace = TraceWriter(tmp_path / "run")
    trace.start(task="replay --heal out.py")
    _write_trace(trace, "", result)
    page = render_report(read_trace(tmp_path / "run"))
    assert page.count('class="heal"') == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "page.get_by_text(&quot;Go&quot;, exact=True)" in page
    assert 'data-action="left_click" data-x="160" data-y="100"' in page  # the point the model named, marked


def test_an_element_found_under_a_banner_asks_to_close_the_banner_first(service):
    hook = _Hook(service.path)
    hook.ask(_question())
    found = {"type": "resolved", "locator": {"kind": "css", "selector": "#banner"}, "problem": "not a button"}
    assert hook.ask(dict(found, covered=True)) == {"cover": True}
    assert service.heals == [] and service.stopped == ""  # not a heal, and not a stop: the banner comes first


def test_the_model_is_asked_a_bounded_number_of_times(service, monkeypatch):
    monkeypatch.setattr(heal, "MAX_HEALS", 1)
    hook = _Hook(service.path)
    found = {"type": "resolved", "locator": {"kind": "css", "selector": "#b"}, "problem": "x", "covered": True}
    for _ in range(3):
        assert "point" in hook.ask(_question())
        assert hook.ask(found) == {"cover": True}
    assert "page changed too much" in hook.ask(_question())["stop"]


def test_a_locator_from_inside_the_sandbox_is_taken_only_in_the_shapes_locate_makes():
    from qvl_agent.scripts.heal.service import clean_locator

    row = {
        "kind": "within",
        "item": "tr",
        "has_text": "#1002",
        "inner": {"kind": "role", "role": "button", "name": "Delete"},
    }
    assert clean_locator(dict(row, extra="dropped")) == row
    assert clean_locator(dict(row, inner=row)) is None  # an item inside an item
    assert clean_locator(dict(row, inner={"kind": "point", "x": 1, "y": 2})) is None
    assert clean_locator(dict(row, has_text="")) is None and clean_locator(dict(row, item=["tr"])) is None
    assert clean_locator(dict(row, has_text="x" * 10_000)) is None
    assert clean_locator({"kind": "item", "item": "tr", "has_text": "#1002"}) is None  # never a step's element
