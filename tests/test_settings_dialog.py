"""The settings dialog: values round-trip through the TOML file; bad values are refused with a message."""

from __future__ import annotations

import dataclasses

import pytest

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


def test_settings_round_trip_through_the_file(qtbot, path, tmp_path):
    model_dir = tmp_path / "my-model"
    dialog = open_dialog(qtbot, Settings(), path)
    dialog.model.setText(str(model_dir))
    dialog.device.setCurrentText("cpu")
    dialog.max_pixels.setText("2_073_600")
    dialog.hotkey_ask.setText("<ctrl>+<shift>+a")
    dialog.hotkey_region.setText("<ctrl>+<shift>+r")
    dialog.hotkey_stop.setText("<ctrl>+<shift>+<esc>")
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
    assert again.hotkey_ask.text() == "<ctrl>+<shift>+a"
    assert again.safety_mode.currentText() == "dry-run"
    assert not list(path.parent.glob(".*.tmp"))  # the atomic write left nothing behind


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_pixels", "lots", "whole number"),
        ("max_pixels", "1000", "at least 65536"),
        ("device", "tpu", "device must be"),
        ("model", "  ", "model cannot be empty"),
        ("hotkey_ask", "ctrl+alt+q", "angle brackets"),
        ("hotkey_ask", "<ctrl>+<alt>+<nokey>", "unknown key"),
        ("hotkey_ask", "q", "needs a modifier"),
        ("hotkey_ask", "<ctrl>+<alt>", "besides the modifiers"),
        ("hotkey_region", "<ctrl>+<alt>+q", "must all be different"),
    ],
)
def test_invalid_values_are_refused_and_nothing_is_written(qtbot, path, field, value, message):
    dialog = open_dialog(qtbot, Settings(), path)
    widget = getattr(dialog, field)
    if hasattr(widget, "setCurrentText"):
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
    with pytest.raises(ConfigError):
        check_hotkey("<ctrl>+<ctrl>+q")
