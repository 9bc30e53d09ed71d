"""The export compiler on recorded steps (pure: no browser). End-to-end replays are in test_browser.py."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from qvl_agent.errors import InputError
from qvl_agent.playwright.export import compile_run, export_trace, python_locator, write_browser_info
from qvl_agent.playwright.policy import check_script
from qvl_agent.trace import TraceWriter

URL = "http://127.0.0.1:8000/form.html"
NAME = {"kind": "role", "role": "textbox", "name": "Name"}
AGREE = {"kind": "label", "text": "I agree"}
COUNTRY = {"kind": "role", "role": "combobox", "name": "Country"}
GO = {"kind": "role", "role": "button", "name": "Go"}


def text(value):
    return {"tag": "input", "type": "", "value": value}


def box(checked):
    return {"tag": "input", "type": "checkbox", "checked": checked}


def sel(value, label):
    return {"tag": "select", "type": "", "value": value, "label": label}


def step(kind, locator=None, before=None, after=None, url=URL, **extra):
    detail = {"url": url, **extra}
    if locator is not None:
        detail.update(locator=locator, before=before, after=after)
    return {"kind": kind, "ok": True, "detail": detail, "describe": kind}


def body(source: str) -> list[str]:
    """The statements of replay(), without comments."""
    start = source.index("def replay(page, origin):")
    end = source.index("def main():")
    return [
        line.strip() for line in source[start:end].splitlines()[1:] if line.strip() and not line.strip().startswith("#")
    ]


def test_click_typing_and_editing_keys_become_one_fill_with_the_final_value():
    steps = [
        step("left_click", NAME, text(""), text(""), pixels=[[10, 10]]),
        step("type", NAME, text(""), text("Adaa"), text="Adaa"),
        step("triple_click", NAME, text("Adaa"), text("Adaa"), pixels=[[10, 10]]),  # select all, retype
        step("type", NAME, text("Adaa"), text("Adaa"), text="Adaa"),
        step("key", NAME, text("Adaa"), text("Ada"), keys="Backspace"),
        step("key", NAME, text("Ada"), text("Ada"), keys="Tab"),
    ]
    lines = body(compile_run(URL, steps).source)
    assert lines[:2] == [
        'page.get_by_role("textbox", name="Name", exact=True).fill("Ada")',
        'page.get_by_role("textbox", name="Name", exact=True).press("Tab")',
    ]


def test_typing_that_submits_becomes_fill_then_enter_and_a_url_expectation():
    steps = [
        step("left_click", NAME, text(""), text(""), pixels=[[10, 10]]),
        step("type", NAME, text(""), None, text="Ada\n"),  # the form was submitted: the field is gone
        step("left_click", GO, {"tag": "button"}, None, url="http://127.0.0.1:8000/done?x=1", pixels=[[5, 5]]),
    ]
    lines = body(compile_run(URL, steps).source)
    assert lines[:4] == [
        'page.get_by_role("textbox", name="Name", exact=True).fill("Ada")',
        'page.get_by_role("textbox", name="Name", exact=True).press("Enter")',
        'expect(page).to_have_url(origin + "/done?x=1")',
        'page.get_by_role("button", name="Go", exact=True).click()',
    ]


def test_checkboxes_check_uncheck_or_click_by_what_changed():
    steps = [
        step("left_click", AGREE, box(False), box(True), pixels=[[1, 1]]),
        step("left_click", AGREE, box(True), box(False), pixels=[[1, 1]]),
        step("left_click", AGREE, box(True), box(True), pixels=[[1, 1]]),  # a disabled or prevented click
        step("key", AGREE, box(False), box(True), keys="Space"),
    ]
    assert body(compile_run(URL, steps).source) == [
        'page.get_by_label("I agree", exact=True).check()',
        'page.get_by_label("I agree", exact=True).uncheck()',
        'page.get_by_label("I agree", exact=True).click()',
        'page.get_by_label("I agree", exact=True).check()',
        'expect(page).to_have_url(origin + "/form.html")',
    ]


def test_a_select_opened_typed_into_and_confirmed_is_one_select_option():
    steps = [
        step("left_click", COUNTRY, sel("", "Choose"), sel("", "Choose"), pixels=[[3, 3]]),
        step("type", COUNTRY, sel("", "Choose"), sel("", "Choose"), text="Jap"),
        step("key", COUNTRY, sel("", "Choose"), sel("jp", "Japan"), keys="Enter"),
    ]
    lines = body(compile_run(URL, steps).source)
    assert lines[0] == 'page.get_by_role("combobox", name="Country", exact=True).select_option(label="Japan")'
    assert len([line for line in lines if "Country" in line]) == 1


def test_a_click_without_a_unique_locator_falls_back_to_pixels_and_says_so():
    steps = [step("double_click", {"kind": "point", "x": 40, "y": 50}, None, None, pixels=[[40, 50]])]
    compiled = compile_run(URL, steps)
    assert "page.mouse.click(40, 50, click_count=2)" in body(compiled.source)
    assert compiled.unexpressed and "CSS pixel (40, 50)" in compiled.unexpressed[0]


def test_final_state_becomes_expect_assertions():
    final = {
        "url": "http://127.0.0.1:8000/form.html#sent",
        "fields": [
            {"locator": NAME, "state": text("Ada")},
            {"locator": AGREE, "state": box(False)},
            {"locator": COUNTRY, "state": sel("jp", "Japan")},
        ],
        "new_text": ["Thanks, Ada"],
    }
    lines = body(compile_run(URL, [step("left_click", GO, {"tag": "button"}, None, pixels=[[1, 1]])], final).source)
    assert lines[1:] == [
        'expect(page).to_have_url(origin + "/form.html#sent")',
        'expect(page.get_by_role("textbox", name="Name", exact=True)).to_have_value("Ada")',
        'expect(page.get_by_label("I agree", exact=True)).not_to_be_checked()',
        'expect(page.get_by_role("combobox", name="Country", exact=True)).to_have_value("jp")',
        'expect(page.get_by_text("Thanks, Ada", exact=True)).to_be_visible()',
    ]


def test_waits_are_not_replayed_and_failed_steps_are_skipped():
    steps = [
        step("wait", None, seconds=3),
        {"kind": "left_click", "ok": False, "detail": {}, "describe": "left_click"},
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[1, 1]]),
    ]
    lines = body(compile_run(URL, steps).source)
    assert lines[0] == 'page.get_by_role("button", name="Go", exact=True).click()'
    assert not any("wait_for_timeout" in line or "sleep" in line for line in lines)


def test_awkward_names_are_quoted_safely_and_the_script_is_valid_and_allowed():
    odd = {"kind": "role", "role": "button", "name": 'Say "hi" \\ to Zoë\n'}
    steps = [step("left_click", odd, {"tag": "button"}, {"tag": "button"}, pixels=[[1, 1]])]
    source = compile_run(URL, steps, task='Press "hi"\n"""; import os').source
    ast.parse(source)
    check_script(source)
    assert "qvl_agent" not in source
    code = python_locator(odd)
    assert ast.literal_eval(code[code.index("name=") + 5 : code.index(", exact")]) == odd["name"]


def test_export_reads_a_trace_folder(tmp_path):
    trace = TraceWriter(tmp_path / "run")
    trace.start(task="Press Go", engine="replay", executor="browser")
    trace.step(
        {
            "step": 1,
            "actions": [{"action": "left_click", "coordinate": [10, 10]}],
            "results": [
                {
                    "action": "left_click at (10, 10)",
                    "ok": True,
                    "message": "",
                    "detail": step("left_click", GO, {"tag": "button"}, None, pixels=[[1, 1]])["detail"],
                }
            ],
        }
    )
    trace.step(
        {
            "step": 2,
            "actions": [{"action": "terminate", "status": "success"}],
            "results": [{"action": "terminate (success)", "ok": True, "message": "success"}],
        }
    )
    trace.end(status="success")
    trace.close()
    with pytest.raises(InputError, match="not a browser run"):
        export_trace(tmp_path / "run", tmp_path / "out.py")
    write_browser_info(tmp_path / "run", URL, (800, 600), {"url": URL, "fields": [], "new_text": []})
    compiled = export_trace(tmp_path / "run", tmp_path / "out.py")
    source = (tmp_path / "out.py").read_text()
    assert source == compiled.source
    assert 'page.get_by_role("button", name="Go", exact=True).click()' in source
    assert 'VIEWPORT = {"width": 800, "height": 600}' in source
    assert "Press Go" in source


def test_an_exported_script_without_a_browser_says_so_in_one_line(tmp_path):
    script = tmp_path / "replay.py"
    steps = [step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[1, 1]])]
    script.write_text(compile_run(URL, steps).source)
    out = subprocess.run(
        [sys.executable, str(script), "--browser", str(tmp_path / "no-such-chromium")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == "No Chromium found: pass --browser PATH or set QVL_BROWSER."
    assert out.stdout == ""
