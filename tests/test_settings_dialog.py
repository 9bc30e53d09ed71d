"""The settings dialog: values round-trip through the TOML file; bad values are refused with a message;
hotkeys are recorded by pressing them and shown as people write them; nothing is cut off."""

from __future__ import annotations

import dataclasses
import os

import pytest
from PySide6.QtCore import Qt

from qvl_agent import config
from qvl_agent.config import Hotkeys, Settings
from qvl_agent.errors import ConfigError


@pytest.fixture(scope="session")
def qapp_args():
    return ["qvl-agent-tests", "-platform", "offscreen"]


@pytest.fixture
def path(tmp_path):
    return tmp_path / "config" / "config.toml"


def open_dialog(qtbot, settings, path):
    from qvl_agent.ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(settings, path)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


CTRL, ALT, SHIFT = (
    Qt.KeyboardModifier.ControlModifier,
    Qt.KeyboardModifier.AltModifier,
    Qt.KeyboardModifier.ShiftModifier,
)


def press(qtbot, field, key, modifiers=Qt.KeyboardModifier.NoModifier):
    """Press a key combination in a hotkey field, as a person records one."""
    field.setFocus()
    qtbot.keyClick(field, key, modifiers)


def test_settings_round_trip_through_the_file(qtbot, path, tmp_path):
    model_dir = tmp_path / "my-model"
    dialog = open_dialog(qtbot, Settings(), path)
    dialog.model.setText(str(model_dir))
    dialog.device.setCurrentText("cpu")
    dialog.max_pixels.setText("2_073_600")
    press(qtbot, dialog.hotkey_ask, Qt.Key.Key_A, CTRL | SHIFT)
    press(qtbot, dialog.hotkey_region, Qt.Key.Key_R, CTRL | SHIFT)
    press(qtbot, dialog.hotkey_stop, Qt.Key.Key_Escape, CTRL | SHIFT)
    assert [dialog.hotkey_ask.text(), dialog.hotkey_stop.text()] == ["Ctrl+Shift+A", "Ctrl+Shift+Esc"]
    dialog.safety_mode.setCurrentText("dry-run")
    with qtbot.waitSignal(dialog.saved) as saved:
        dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert dialog.error.text() == ""
    loaded = config.load(path, env={}).settings
    assert loaded.model == str(model_dir)
    assert loaded.device == "cpu"
    assert loaded.max_pixels == 2_073_600
    assert loaded.hotkeys == Hotkeys("<ctrl>+<shift>+a", "<ctrl>+<shift>+r", "<ctrl>+<shift>+<esc>")
    assert loaded.safety_mode == "dry-run"
    assert saved.args[0] == loaded
    # Opening the dialog again shows what was saved.
    again = open_dialog(qtbot, loaded, path)
    assert again.max_pixels.text() == "2073600"
    assert again.hotkey_ask.text() == "Ctrl+Shift+A"
    assert again.safety_mode.currentText() == "dry-run"
    assert not list(path.parent.glob(".*.tmp"))  # the atomic write left nothing behind


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_pixels", "lots", "whole number"),
        ("max_pixels", "1000", "at least 65536"),
        ("device", "tpu", "device must be"),
        ("model", "  ", "model cannot be empty"),
        ("engine", "vllm", "Engine must be local, openai:URL"),
        ("engine", "openai:", "Engine must be local, openai:URL"),
        ("hotkey_ask", (Qt.Key.Key_Q,), "The ask hotkey Q needs a modifier"),
        ("hotkey_region", (Qt.Key.Key_Q, CTRL | ALT), "must all be different"),
        ("hotkey_stop", (Qt.Key.Key_Backspace,), "The stop hotkey is empty"),
    ],
)
def test_invalid_values_are_refused_and_nothing_is_written(qtbot, path, field, value, message):
    dialog = open_dialog(qtbot, Settings(), path)
    widget = getattr(dialog, field)
    if isinstance(value, tuple):
        press(qtbot, widget, *value)
    elif hasattr(widget, "setCurrentText"):
        widget.setCurrentText(value)
    else:
        widget.setText(value)
    saved = []
    dialog.saved.connect(saved.append)
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert message in dialog.error.text()
    assert dialog.isVisible()  # the dialog stays open for a correction
    assert saved == []
    assert not path.exists()


def test_saving_keeps_file_values_and_leaves_out_this_runs_flags(qtbot, path):
    config.save(dataclasses.replace(Settings(), max_new_tokens=99, browser="/opt/chromium"), path)
    # This run was started with --engine replay:... and QVL_SAFETY_MODE: neither may leak into the file.
    running = dataclasses.replace(config.load(path, env={}).settings, engine="replay:/tmp/x.json")
    dialog = open_dialog(qtbot, running, path)
    dialog.device.setCurrentText("cpu")
    with qtbot.waitSignal(dialog.saved) as saved:
        dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    on_file = config.load(path, env={}).settings
    assert on_file.device == "cpu"
    assert on_file.max_new_tokens == 99 and on_file.browser == "/opt/chromium"
    assert on_file.engine == "local"
    assert saved.args[0].engine == "replay:/tmp/x.json"  # the running app keeps its engine


def test_hotkey_check_accepts_the_defaults_and_function_keys():
    from qvl_agent.ui.hotkeys import check_hotkey, check_hotkeys

    check_hotkeys(Hotkeys())
    assert check_hotkey("<f9>") == "<f9>"
    for bad, message in [
        ("<ctrl>+<ctrl>+q", "repeats"),
        ("ctrl+alt+q", "angle brackets"),  # as written by hand in config.toml
        ("<ctrl>+<alt>+<nokey>", "unknown key"),
        ("<ctrl>+<alt>", "besides the modifiers"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_hotkey(bad)


@pytest.mark.parametrize(
    "combo, label",
    [
        ("<ctrl>+<alt>+q", "Ctrl+Alt+Q"),
        ("<ctrl>+<alt>+<esc>", "Ctrl+Alt+Esc"),
        ("<ctrl_l>+<shift>+<page_up>", "Ctrl+Shift+PgUp"),
        ("<cmd>+<space>", "Super+Space"),
        ("<alt_gr>+1", "AltGr+1"),
        ("<f9>", "F9"),
    ],
)
def test_hotkeys_are_shown_as_people_write_them(combo, label):
    assert config.hotkey_label(combo) == label


def test_a_hotkey_is_recorded_by_pressing_it_and_enter_and_esc_still_reach_the_dialog(qtbot, path):
    dialog = open_dialog(qtbot, Settings(), path)
    field = dialog.hotkey_region
    assert field.text() == "Ctrl+Alt+R"
    # Modifiers alone only preview; letting go shows the value again.
    field.setFocus()
    qtbot.keyPress(field, Qt.Key.Key_Control, CTRL)
    qtbot.keyPress(field, Qt.Key.Key_Alt, CTRL | ALT)
    assert field.text() == "Ctrl+Alt+…"
    qtbot.keyRelease(field, Qt.Key.Key_Alt, CTRL | ALT)  # lets go of Ctrl too
    assert field.text() == "Ctrl+Alt+R"
    press(qtbot, field, Qt.Key.Key_F7, CTRL | SHIFT)
    assert (field.text(), field.hotkey()) == ("Ctrl+Shift+F7", "<ctrl>+<shift>+<f7>")
    press(qtbot, field, Qt.Key.Key_5, ALT)
    assert field.hotkey() == "<alt>+5"
    # Typing does not edit the text: a press of x without modifiers is recorded as the key x.
    press(qtbot, field, Qt.Key.Key_X)
    assert field.hotkey() == "x"
    press(qtbot, field, Qt.Key.Key_S, CTRL | ALT)
    with qtbot.waitSignal(dialog.saved) as saved:
        press(qtbot, field, Qt.Key.Key_Return)  # Enter saves, it is not recorded
    assert saved.args[0].hotkeys.region == "<ctrl>+<alt>+s"
    assert config.load(path, env={}).settings.hotkeys.region == "<ctrl>+<alt>+s"

    again = open_dialog(qtbot, Settings(), path)
    press(qtbot, again.hotkey_ask, Qt.Key.Key_Escape)  # Esc cancels the dialog
    assert not again.isVisible()


def test_the_dialog_shows_whole_values_and_stays_above_the_ask_windows(qtbot, path, tmp_path):
    long_model = str(tmp_path / "models" / "Qwen3-VL-2B-Instruct")
    dialog = open_dialog(qtbot, Settings(model=long_model, safety_mode="dry-run"), path)
    qtbot.waitExposed(dialog)
    for field in (dialog.model, dialog.max_pixels, dialog.hotkey_ask, dialog.hotkey_region, dialog.hotkey_stop):
        shown = field.fontMetrics().horizontalAdvance(field.text())
        assert field.width() > shown + 8, f"{field.text()!r} is cut off"
    for combo in (dialog.device, dialog.safety_mode):
        assert combo.width() >= combo.minimumSizeHint().width()
    assert dialog.windowFlags() & Qt.WindowType.WindowStaysOnTopHint


def test_only_what_the_person_changed_is_written_and_every_other_key_stays(qtbot, path):
    path.parent.mkdir(parents=True)
    original = (
        'model = "/models/mine"\n'
        "max_new_tokens = 77\n"
        'future_setting = "kept"  # a key this version does not know\n'
        "\n[hotkeys]\n"
        'region = "<ctrl>+<alt>+r"\n'
        "\n[plugins.someday]\n"
        "level = 3\n"
    )
    path.write_text(original)
    # This run: started with --engine replay:... and QVL_MAX_PIXELS; the file says nothing about either.
    running = dataclasses.replace(config.load(path, env={}).settings, engine="replay:/tmp/x.json", max_pixels=1_000_000)
    dialog = open_dialog(qtbot, running, path)
    assert dialog.engine.currentText() == "replay:/tmp/x.json"  # the dialog shows the engine in use
    dialog.device.setCurrentText("cpu")
    press(qtbot, dialog.hotkey_stop, Qt.Key.Key_F9, CTRL | ALT)
    with qtbot.waitSignal(dialog.saved) as saved:
        dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    import tomllib

    data = tomllib.loads(path.read_text())
    assert data == {
        "model": "/models/mine",
        "max_new_tokens": 77,
        "future_setting": "kept",
        "hotkeys": {"region": "<ctrl>+<alt>+r", "stop": "<ctrl>+<alt>+<f9>"},
        "plugins": {"someday": {"level": 3}},
        "device": "cpu",
    }
    assert saved.args[0].engine == "replay:/tmp/x.json" and saved.args[0].max_pixels == 1_000_000


def test_the_engine_is_edited_in_the_dialog_and_saved(qtbot, path):
    dialog = open_dialog(qtbot, Settings(), path)
    assert dialog.engine.currentText() == "local"
    dialog.engine.setCurrentText("openai:http://127.0.0.1:8000/v1")
    old_umask = os.umask(0)  # a careless umask must not make the file others can write (then refused on load)
    try:
        with qtbot.waitSignal(dialog.saved) as saved:
            dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    finally:
        os.umask(old_umask)
    assert path.read_text() == 'engine = "openai:http://127.0.0.1:8000/v1"\n'
    assert path.stat().st_mode & 0o777 == 0o600
    assert saved.args[0].engine == "openai:http://127.0.0.1:8000/v1"
    assert config.load(path, env={}).settings.engine == "openai:http://127.0.0.1:8000/v1"


def test_a_settings_file_that_is_not_toml_is_never_overwritten(qtbot, path):
    path.parent.mkdir(parents=True)
    path.write_text("max_pixels = [oops\n")
    dialog = open_dialog(qtbot, Settings(), path)
    dialog.device.setCurrentText("cpu")
    saved = []
    dialog.saved.connect(saved.append)
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert "is not valid TOML" in dialog.error.text() and "nothing was written" in dialog.error.text()
    assert path.read_text() == "max_pixels = [oops\n" and saved == []


def test_the_take_over_hotkey_is_edited_and_saved_as_takeover_hotkey(qtbot, path):
    import tomllib

    path.parent.mkdir(parents=True)
    path.write_text('[hotkeys]\nask = "<ctrl>+<shift>+a"\ntakeover = "<ctrl>+<alt>+y"\n')  # an earlier spelling
    current = config.load(path, env={}).settings
    dialog = open_dialog(qtbot, current, path)
    assert dialog.hotkey_takeover.hotkey() == "<ctrl>+<alt>+y"
    press(qtbot, dialog.hotkey_takeover, Qt.Key.Key_T, CTRL | SHIFT)
    with qtbot.waitSignal(dialog.saved) as saved:
        dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert tomllib.loads(path.read_text()) == {
        "takeover_hotkey": "<ctrl>+<shift>+t",
        "hotkeys": {"ask": "<ctrl>+<shift>+a"},
    }
    assert saved.args[0].hotkeys.takeover == "<ctrl>+<shift>+t"
    assert config.load(path, env={}).settings.hotkeys.takeover == "<ctrl>+<shift>+t"

    again = open_dialog(qtbot, config.load(path, env={}).settings, path)
    press(qtbot, again.hotkey_takeover, Qt.Key.Key_A, CTRL | SHIFT)  # the ask hotkey's
    again.buttons.button(again.buttons.StandardButton.Save).click()
    assert "takeover_hotkey must all be different" in again.error.text() and again.isVisible()
