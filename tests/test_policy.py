"""The script policy: model-written Playwright scripts that could harm the machine never run."""

from __future__ import annotations

import pytest

from qvl_agent.script_policy import ScriptRejected, check_script, verdict

HEADER = "from playwright.sync_api import sync_playwright, expect\n"

GOOD = (
    HEADER
    + """
import argparse
import os
import re
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--browser", default=os.environ.get("QVL_BROWSER"))
args = parser.parse_args()
ARGS = ["--disable-background-networking", "--no-first-run"]

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=args.browser, args=ARGS)
    page = browser.new_page()
    page.goto(sys.argv[-1])
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page).to_have_url(re.compile(".*welcome"))
    print("done")
    browser.close()
"""
)


def test_a_plain_playwright_script_passes():
    check_script(GOOD)
    assert verdict(GOOD).ok


@pytest.mark.parametrize(
    "snippet, reason",
    [
        ("import os\nos.system('rm -rf /')", "os.system"),
        ("from os import system\nsystem('ls')", "os.system"),
        ("import subprocess\nsubprocess.run(['ls'])", "subprocess"),
        ("from subprocess import Popen", "subprocess"),
        ("eval('1+1')", "eval"),
        ("exec('x = 1')", "exec"),
        ("compile('1', 'f', 'eval')", "compile"),
        ("m = __import__('os')", "__import__"),
        ("getattr(__builtins__, 'ev' + 'al')('1')", "getattr"),
        ("open('/tmp/x', 'w').write('owned')", "open() may only read"),
        ("open('/tmp/x', mode='a')", "open() may only read"),
        ("m = 'w'\nopen('/tmp/x', m)", "open() may only read"),
        ("import pathlib\npathlib.Path('x').write_text('y')", "pathlib"),
        ("x = None\nx.write_text('y')", "write_text"),
        ("import socket", "socket"),
        ("import urllib.request", "urllib"),
        ("import requests", "requests"),
        ("import httpx", "httpx"),
        ("import shutil", "shutil"),
        ("import sys\nmods = sys.modules", "sys.modules"),
        ("import os as o\nx = o\nx.system('ls')", "only be used as"),
        ("().__class__.__bases__[0].__subclasses__()", "private attribute"),
        ("page = None\npage.screenshot(path='/etc/passwd')", "path="),
        ("d = None\nd.save_as('/tmp/file')", "save_as"),
        ("p = None\np.chromium.launch(executable_path='/bin/sh')", "executable_path"),
        ("p = None\np.chromium.launch(args=['--renderer-cmd-prefix=/bin/sh'])", "args="),
        ("p = None\nflags = ['--utility-cmd-prefix=sh']\np.chromium.launch(args=flags)", "args="),
        ("p = None\np.chromium.launch_persistent_context('/tmp/profile')", "launch_persistent_context"),
        ("import argparse\nargparse.FileType('w')", "FileType"),
        ("from playwright._impl import _api_types", "playwright._impl"),
        ("f = None\nf(**{'path': 'x'})", "keyword arguments"),
        ("async def go():\n    pass", "async"),
    ],
)
def test_dangerous_scripts_are_rejected_with_a_reason(snippet, reason):
    source = HEADER + snippet + "\n"
    with pytest.raises(ScriptRejected) as info:
        check_script(source)
    message = str(info.value)
    assert reason in message
    assert message.startswith("Line ") and message.endswith(".")
    assert "\n" not in message


def test_syntax_errors_and_non_playwright_scripts_are_rejected():
    assert not verdict("def broken(:\n").ok
    assert "not valid Python" in verdict("def broken(:\n").reason
    assert "Playwright" in verdict("print('hello')\n").reason
    assert "empty" in verdict("   \n").reason


def test_reading_a_file_is_allowed_but_writing_is_not():
    assert verdict(HEADER + "data = open('input.txt').read()\n").ok
    assert verdict(HEADER + "data = open('input.txt', 'rb').read()\n").ok
    assert not verdict(HEADER + "open('out.txt', 'wb')\n").ok
