"""Pure parts of the browser executor: key names, viewport parsing, and which Chromium is used."""

from __future__ import annotations

import pytest

from qvl_agent.act import browser as B
from qvl_agent.errors import ActionError, BrowserError, UsageError
from qvl_agent.playwright import chromium


@pytest.mark.parametrize(
    "keys, expected",
    [
        (("ctrl", "a"), "Control+a"),
        (("enter",), "Enter"),
        (("Return",), "Enter"),
        (("esc",), "Escape"),
        (("shift", "tab"), "Shift+Tab"),
        (("ctrl", "shift", "Page_Down"), "Control+Shift+PageDown"),
        (("cmd", "c"), "Meta+c"),
        (("space",), "Space"),
        (("up",), "ArrowUp"),
        (("f5",), "F5"),
        (("A",), "A"),
    ],
)
def test_qwen_key_names_map_to_playwright(keys, expected):
    assert B.playwright_key(keys) == expected


def test_an_unknown_key_is_an_error_for_the_model():
    with pytest.raises(ActionError, match="Unknown key 'hyper'"):
        B.playwright_key(("ctrl", "hyper"))


def test_viewports_parse_or_refuse_in_one_sentence():
    assert B.parse_viewport("1280x800") == (1280, 800)
    assert B.parse_viewport("1024X768") == (1024, 768)
    for bad in ("big", "1280", "10x10", "1280x800x2"):
        with pytest.raises(UsageError):
            B.parse_viewport(bad)


def test_the_browser_comes_from_the_flag_then_the_setting_then_playwright_then_the_system(tmp_path, monkeypatch):
    flag, setting, bundled = (tmp_path / name for name in ("flag-chrome", "env-chrome", "pw-chrome"))
    for exe in (flag, setting, bundled):
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    assert chromium.find_browser(str(flag), str(setting), str(bundled)) == str(flag)
    assert chromium.find_browser(None, str(setting), str(bundled)) == str(setting)
    assert chromium.find_browser(None, "", str(bundled)) == str(bundled)
    monkeypatch.setattr(chromium, "SYSTEM_CHROMIUMS", (str(tmp_path / "none"), str(setting)))
    assert chromium.find_browser(None, "", str(tmp_path / "not-installed")) == str(setting)
    with pytest.raises(BrowserError, match="given by --browser does not exist"):
        chromium.find_browser(str(tmp_path / "missing"), str(setting))
    monkeypatch.setattr(chromium, "SYSTEM_CHROMIUMS", (str(tmp_path / "none"),))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BrowserError, match="No Chromium was found"):
        chromium.find_browser(None, "", None)


def test_a_run_without_a_window_takes_the_headless_shell_and_one_with_a_window_never_does(tmp_path, monkeypatch):
    full, shell = tmp_path / "chromium", tmp_path / "chromium-headless-shell"
    for exe in (full, shell):
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setattr(chromium, "HEADLESS_SHELLS", (str(shell),))
    monkeypatch.setattr(chromium, "SYSTEM_CHROMIUMS", (str(full),))
    assert chromium.find_browser(None, "", None, headless=True) == str(shell)
    assert chromium.find_browser(None, "", None, headless=False) == str(full)
    assert chromium.find_browser(None, "", None) == str(full)
    # What the person names wins, headless or not; a headless shell named for a window is one sentence.
    assert chromium.find_browser(None, str(full), None, headless=True) == str(full)
    with pytest.raises(BrowserError, match="headless shell, which shows no window"):
        chromium.find_browser(str(shell), "", None, headless=False)
    monkeypatch.setattr(chromium, "HEADLESS_SHELLS", (str(tmp_path / "not-installed"),))
    assert chromium.find_browser(None, "", None, headless=True) == str(full)


@pytest.mark.parametrize("key", ["\n", "\t", "\x1b"])
def test_a_control_character_is_no_key_name(key):
    # An exported script would otherwise press "\n+Enter", which Playwright cannot replay.
    with pytest.raises(ActionError, match="Unknown key"):
        B.playwright_key((key, "Enter"))
