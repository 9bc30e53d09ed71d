"""The export compiler on recorded steps (pure: no browser). End-to-end replays are in test_browser.py."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from qvl_agent.errors import InputError
from qvl_agent.scripts.export.exporter import compile_run, export_trace, python_locator, write_browser_info
from qvl_agent.scripts.write.policy import check_script
from qvl_agent.secrets import Secrets
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


def test_a_step_found_by_its_place_alone_first_checks_the_element_there_reads_as_recorded():
    by_place = {"kind": "css", "selector": "body > div:nth-of-type(3) > button"}
    steps = [
        step("left_click", by_place, None, None, pixels=[[5, 5]], element={"tag": "button", "text": "Delete"}),
        step("left_click", GO, None, None, pixels=[[1, 1]], element={"tag": "button", "text": "Go"}),
    ]
    source = compile_run(URL, steps).source
    assert body(source)[:2] == [
        'expect(page.locator("body > div:nth-of-type(3) > button")).to_have_text("Delete", use_inner_text=True)',
        'page.locator("body > div:nth-of-type(3) > button").click()',
    ]
    assert body(source)[2] == 'page.get_by_role("button", name="Go", exact=True).click()'  # its name is its check
    assert '"by_position": true' in source  # and the intent says how it was found


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


NOTE = {"kind": "role", "role": "textbox", "name": "Note"}
DAY = {"kind": "label", "text": "Arrival date"}
PIN = {"kind": "label", "text": "Code"}
TOPPINGS = {"kind": "role", "role": "listbox", "name": "Toppings"}
WORDS = {"kind": "text", "text": "apple banana cherry fig"}


def at(offset, box, tag="input", type_="", hits_other=False, role=""):
    """What the executor records about where a pointer action hit its element."""
    element = {"tag": tag, "type": type_, "role": role, "css": "#x", "box": box}
    return {"pixels": [[1, 1]], "offset": offset, "element": element, "centre_hits_other": hits_other}


def multi(values, labels):
    return {
        "tag": "select",
        "type": "",
        "multiple": True,
        "value": values[:1] and values[0] or "",
        "values": values,
        "labels": labels,
    }


def test_keys_the_page_listens_to_stay_key_presses_after_a_click_at_the_run_s_point():
    listening = {"tag": "input", "type": "", "value": "", "keys": True}
    steps = [
        step("left_click", PIN, listening, listening, **at([12, 9], [100, 100, 160, 30])),
        step("type", PIN, listening, listening, text="7342"),  # the page cleared the field on every key
        step("key", PIN, listening, listening, keys="Backspace"),
    ]
    assert body(compile_run(URL, steps).source)[:3] == [
        'page.get_by_label("Code", exact=True).click(position={"x": 12, "y": 9})',
        'page.get_by_label("Code", exact=True).press_sequentially("7342")',
        'page.get_by_label("Code", exact=True).press("Backspace")',
    ]


def test_a_field_that_rewrites_what_was_typed_keeps_the_keys_even_without_a_known_listener():
    steps = [step("type", NAME, text(""), text(""), text="7342")]  # typed, yet the value stayed empty
    assert body(compile_run(URL, steps).source)[0].endswith('.press_sequentially("7342")')


def test_select_all_stays_a_key_press_before_copy_and_is_folded_into_typing_that_replaces_it():
    source = compile_run(
        URL,
        [
            step("left_click", NAME, text("TRK-1"), text("TRK-1"), **at([5, 5], [0, 0, 100, 20])),
            step("key", NAME, text("TRK-1"), text("TRK-1"), keys="Control+a"),
            step("key", NAME, text("TRK-1"), text("TRK-1"), keys="Control+c"),
            step("left_click", AGREE, box(False), box(True), pixels=[[1, 1]]),
            step("left_click", NAME, text("TRK-1"), text("TRK-1"), **at([5, 5], [0, 0, 100, 20])),
            step("key", NAME, text("TRK-1"), text("TRK-1"), keys="Control+a"),
            step("type", NAME, text("TRK-1"), text("Ada"), text="Ada"),
        ],
    ).source
    name = 'page.get_by_role("textbox", name="Name", exact=True)'
    assert body(source)[:5] == [
        f'{name}.click(position={{"x": 5, "y": 5}})',
        f'{name}.press("Control+a")',
        f'{name}.press("Control+c")',
        'page.get_by_label("I agree", exact=True).check()',
        f'{name}.fill("Ada")',
    ]


def test_a_date_typed_as_keystrokes_is_filled_in_its_iso_form_or_typed_where_the_run_clicked():
    date = {"tag": "input", "type": "date", "value": ""}
    done = {"tag": "input", "type": "date", "value": "2025-03-15"}
    filled = compile_run(
        URL,
        [
            step("left_click", DAY, date, date, **at([14, 12], [40, 100, 150, 30])),
            step("type", DAY, date, done, text="03152025"),
        ],
    ).source
    assert body(filled)[0] == 'page.get_by_label("Arrival date", exact=True).fill("2025-03-15")'
    partial = compile_run(
        URL,
        [
            step("left_click", DAY, date, date, **at([14, 12], [40, 100, 150, 30])),
            step("type", DAY, date, date, text="0315"),  # not a whole date yet: no value to fill
        ],
    ).source
    assert body(partial)[:2] == [
        'page.get_by_label("Arrival date", exact=True).click(position={"x": 14, "y": 12})',
        'page.keyboard.type("0315")',
    ]


def test_a_multi_select_keeps_every_option_chosen_with_ctrl():
    none, ham, both = multi([], []), multi(["ham"], ["Ham"]), multi(["ham", "onion"], ["Ham", "Onion"])
    steps = [
        step("left_click", TOPPINGS, none, ham, **at([20, 30], [0, 0, 55, 87], tag="select")),
        step("key", TOPPINGS, ham, ham, keys="Control+ArrowDown"),
        step("key", TOPPINGS, ham, ham, keys="Control+ArrowDown"),
        step("key", TOPPINGS, ham, both, keys="Control+Space"),
    ]
    final = {"url": URL, "fields": [{"locator": TOPPINGS, "state": both}], "new_text": []}
    lines = body(compile_run(URL, steps, final).source)
    toppings = 'page.get_by_role("listbox", name="Toppings", exact=True)'
    assert lines == [
        f'{toppings}.select_option(label=["Ham", "Onion"])',
        'expect(page).to_have_url(origin + "/form.html")',
        f'expect({toppings}).to_have_values(["ham", "onion"])',
    ]


def test_a_double_click_keeps_its_point_and_a_button_click_needs_none():
    words = {"tag": "p", "type": ""}
    steps = [
        step("double_click", WORDS, words, words, **at([300.5, 11], [40, 60, 420, 24], tag="p")),
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, **at([3, 4], [0, 0, 60, 30], tag="button")),
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, **at([3, 4], [0, 0, 60, 30], "button", "", True)),
        step("left_click", AGREE, box(True), box(True), **at([-40, 4], [0, 0, 13, 13], type_="checkbox")),
    ]
    assert body(compile_run(URL, steps).source)[:4] == [
        'page.get_by_text("apple banana cherry fig", exact=True).dblclick(position={"x": 300.5, "y": 11})',
        'page.get_by_role("button", name="Go", exact=True).click()',
        # its centre would hit another target: the run's point it is
        'page.get_by_role("button", name="Go", exact=True).click(position={"x": 3, "y": 4})',
        'page.get_by_label("I agree", exact=True).click()',  # clicked through its label: outside its box
    ]


def test_a_contenteditable_element_is_checked_by_its_text_never_by_a_value():
    editor = {"tag": "div", "type": "", "value": "Buy oat milk\n", "editable": True}
    final = {"url": URL, "fields": [{"locator": NOTE, "state": editor}], "new_text": []}
    lines = body(
        compile_run(URL, [step("type", NOTE, dict(editor, value=""), editor, text="Buy oat milk")], final).source
    )
    assert lines[0] == 'page.get_by_role("textbox", name="Note", exact=True).fill("Buy oat milk\\n")'
    note = 'page.get_by_role("textbox", name="Note", exact=True)'
    assert lines[-1] == f'expect({note}).to_have_text("Buy oat milk\\n", use_inner_text=True)'
    assert not any("to_have_value" in line for line in lines)


def test_a_select_committed_by_tab_or_by_a_later_click_becomes_select_option():
    by_tab = compile_run(
        URL,
        [
            step("left_click", COUNTRY, sel("", "Choose"), sel("", "Choose"), pixels=[[3, 3]]),
            step("type", COUNTRY, sel("", "Choose"), sel("", "Choose"), text="Ger"),
            step("key", COUNTRY, sel("", "Choose"), sel("de", "Germany"), keys="Tab"),
        ],
    ).source
    country = 'page.get_by_role("combobox", name="Country", exact=True)'
    assert body(by_tab)[:2] == [f'{country}.select_option(label="Germany")', f'{country}.press("Tab")']
    later = [
        step("left_click", COUNTRY, sel("", "Choose"), sel("", "Choose"), pixels=[[3, 3]]),
        step("type", COUNTRY, sel("", "Choose"), sel("", "Choose"), text="Ger"),
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[1, 1]]),  # commits the list
    ]
    final = {"url": URL, "fields": [{"locator": COUNTRY, "state": sel("de", "Germany")}], "new_text": ["Saved"]}
    lines = body(compile_run(URL, later, final).source)
    assert lines[:2] == [
        f'{country}.select_option(label="Germany")',
        'page.get_by_role("button", name="Go", exact=True).click()',
    ]
    assert f'expect({country}).to_have_value("de")' in lines


def test_a_select_change_that_cannot_be_expressed_is_a_loud_comment_and_its_checks_are_dropped():
    unlabelled = {"tag": "select", "type": "", "value": "de"}  # which option it was is not known
    steps = [
        step("left_click", COUNTRY, sel("", "Choose"), sel("", "Choose"), pixels=[[3, 3]]),
        step("type", COUNTRY, sel("", "Choose"), sel("", "Choose"), text="Ger"),
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[1, 1]]),
    ]
    final = {
        "url": URL,
        "fields": [{"locator": COUNTRY, "state": unlabelled}, {"locator": NAME, "state": text("Ada")}],
        "new_text": ["Saved for Germany"],
    }
    compiled = compile_run(URL, steps, final)
    lines = body(compiled.source)
    assert not any("Country" in line for line in lines)  # no action on it, and no check of it
    assert 'expect(page.get_by_role("textbox", name="Name", exact=True)).to_have_value("Ada")' in lines
    assert not any("Saved for Germany" in line for line in lines)
    assert "# !!! NOT REPLAYED: step 2: type (moves the highlight)" in compiled.source
    assert any("NOT REPLAYED" in note for note in compiled.unexpressed)


def test_key_names_with_newlines_and_quotes_cannot_break_the_script():
    odd = ['Control+"', "a\nboom()", "\\", "'''", '"""']
    steps = [dict(step("key", NAME, text(""), text(""), keys=k), describe=f"key {k}") for k in odd]
    point = step("double_click", {"kind": "point", "x": 4, "y": 5}, None, None, pixels=[[4, 5]])
    steps.append(dict(point, describe="double_click\nboom()"))  # its note goes to the terminal too
    compiled = compile_run(URL, steps, task='Press\x00 it\n"""')
    assert all("\n" not in note for note in compiled.unexpressed) and compiled.unexpressed
    source = compiled.source
    tree = ast.parse(source)
    check_script(source)
    pressed = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "press" and node.args
    ]
    assert pressed == odd
    assert "boom()" not in [line.strip() for line in source.splitlines()]


def test_a_drag_and_a_hover_keep_their_points_inside_elements_that_care():
    volume = {"kind": "label", "text": "Volume"}
    slider = at([10, 8], [40, 100, 200, 16], type_="range")
    drag = step("left_click_drag", volume, **slider)
    drag["detail"].update(
        pixels=[[50, 108], [190, 108]], end_locator=volume, end_element=slider["element"], end_offset=[150, 8]
    )
    menu = step("mouse_move", GO, **at([5, 5], [0, 0, 60, 30], tag="button"))
    text_box = step("mouse_move", NAME, **at([40, 5], [0, 0, 200, 30]))
    lines = body(compile_run(URL, [drag, menu, text_box]).source)
    volume_code = 'page.get_by_label("Volume", exact=True)'
    assert lines[:3] == [
        f'{volume_code}.drag_to({volume_code}, source_position={{"x": 10, "y": 8}}, '
        'target_position={"x": 150, "y": 8})',
        'page.get_by_role("button", name="Go", exact=True).hover()',
        'page.get_by_role("textbox", name="Name", exact=True).hover(position={"x": 40, "y": 5})',
    ]


def test_a_tab_the_run_opened_is_awaited_as_a_popup_and_an_earlier_tab_taken_up_again():
    survey = "http://127.0.0.1:8000/survey.html"
    link = {"kind": "role", "role": "link", "name": "Survey"}
    steps = [
        step("left_click", link, {"tag": "a"}, {"tag": "a"}, pixels=[[1, 1]]),
        step("left_click", NAME, text(""), text(""), url=survey, tab=1, pixels=[[2, 2]]),
        step("type", NAME, text(""), text("Ada"), url=survey, tab=1, text="Ada"),
        step("left_click", GO, {"tag": "button"}, {"tag": "button"}, pixels=[[3, 3]]),  # back in the first tab
    ]
    source = compile_run(URL, steps, {"url": URL, "fields": [], "new_text": []}).source
    check_script(source)
    assert body(source) == [
        "tabs = [page]",
        "with page.expect_popup() as popup:",
        'page.get_by_role("link", name="Survey", exact=True).click()',
        "page = popup.value",
        "tabs.append(page)",
        'expect(page).to_have_url(origin + "/survey.html")',
        # never folded across tabs; the run left the tab because it closed: the replay waits until it has
        "closing = page",
        "try:",
        'with closing.expect_event("close"):',
        'page.get_by_role("textbox", name="Name", exact=True).fill("Ada")',
        "except Error:",
        "if not closing.is_closed():",
        "raise",
        "page = tabs[0]",
        "page.bring_to_front()",
        'expect(page).to_have_url(origin + "/form.html")',
        'page.get_by_role("button", name="Go", exact=True).click()',
        'expect(page).to_have_url(origin + "/form.html")',
    ]
    # A run that ends in the tab it opened checks the end state there.
    final = {"url": survey, "tab": 1, "fields": [], "new_text": []}
    lines = body(compile_run(URL, steps[:1], final).source)
    end = 'expect(page).to_have_url(origin + "/survey.html")'
    assert lines[-3:] == ["page = popup.value", "tabs.append(page)", end]


def test_text_that_appeared_is_checked_with_any_digits_where_it_had_digits():
    final = {"url": URL, "fields": [], "new_text": ["Ticket 40213 opened at 10:42", "Saved (2 files)", "Done"]}
    source = compile_run(URL, [step("left_click", GO, {"tag": "button"}, None, pixels=[[1, 1]])], final).source
    check_script(source)
    checks = [line for line in body(source) if "get_by_text" in line]
    patterns = [ast.literal_eval(line.split("re.compile(")[1].split(")).first")[0]) for line in checks[:2]]
    assert re.fullmatch(patterns[0], "\n  Ticket 97 opened  at 9:05 ") and not re.search(patterns[0], "Ticket opened")
    assert re.fullmatch(patterns[1], "Saved (13 files)") and not re.search(patterns[1], "Saved 13 files")
    assert checks[2] == 'expect(page.get_by_text("Done", exact=True)).to_be_visible()'


def test_a_secret_is_read_only_where_its_placeholder_was_typed_never_where_its_value_shows():
    """A PIN "Ada" typed by placeholder, then the name "Ada Lovelace" typed as words: the trace masks the
    value wherever it shows ("{{PIN}} Lovelace"), but the export builds each fill from the run's record
    of what was typed, and checks the end state with the same expressions."""
    pin = {"kind": "role", "role": "textbox", "name": "PIN"}
    secrets = Secrets({"PIN": "Ada"})
    steps = [
        {**step("type", pin, text(""), text("{{PIN}}"), text="{{PIN}}"), "typed": secrets.segments("{{PIN}}")},
        {**step("type", NAME, text(""), text("{{PIN}} Lovelace"), text="{{PIN}} Lovelace"),
         "typed": secrets.segments("Ada Lovelace")},
        {**step("type", GO, text(""), text("{{HOME}}"), text="{{HOME}}"), "typed": secrets.segments("{{HOME}}")},
    ]  # fmt: skip
    final = {"url": URL, "fields": [{"locator": pin, "state": text("{{PIN}}")},
                                    {"locator": NAME, "state": text("{{PIN}} Lovelace")}]}  # fmt: skip
    lines = body(compile_run(URL, steps, final).source)
    assert 'page.get_by_role("textbox", name="PIN", exact=True).fill(os.environ["QVL_SECRET_PIN"])' in lines
    assert 'page.get_by_role("textbox", name="Name", exact=True).fill("Ada Lovelace")' in lines
    assert 'page.get_by_role("button", name="Go", exact=True).fill("{{HOME}}")' in lines  # undeclared: text
    assert 'expect(page.get_by_role("textbox", name="Name", exact=True)).to_have_value("Ada Lovelace")' in lines
    assert sum("QVL_SECRET_PIN" in line for line in lines) == 2  # its fill and its end-state check
