"""The script lint: advice for the model, not a wall. Ordinary scripts (scrapers printing in loops, form
fillers, screenshot and PDF savers, scripts writing a CSV) pass; what would make a script fail or miss its
point unattended is sent back with one sentence naming the line. Scripts that slip past any lint over Python
(reflection, argparse file readers, hidden paths) now pass it too: `test_sandbox_hostile.py` and
`test_replay.py` show that running them has no effect on the machine."""

from __future__ import annotations

import pytest

from qvl_agent.scripts.write.policy import ScriptRejected, check_script, verdict

HEADER = "from playwright.sync_api import sync_playwright, expect\n"

SCRAPER = (
    HEADER
    + """
import csv
import os
import sys
from pathlib import Path

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("QVL_BROWSER"))
    page = browser.new_page()
    page.goto(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/shop.html")
    rows = []
    for item in page.locator(".product").all():
        name = item.locator("h2").inner_text()
        price = item.locator(".price").inner_text()
        print(f"{name}: {price}")
        rows.append([name, price])
    os.makedirs("out", exist_ok=True)
    with open(os.path.join("out", "products.csv"), "w", newline="") as f:
        csv.writer(f).writerows(rows)
    Path("out/count.txt").write_text(str(len(rows)))
    print("=" * 40)
    browser.close()
"""
)

FORM_FILLER = (
    HEADER
    + """
import argparse
import json
import time


class LoginPage:
    def __init__(self, page):
        self._page = page

    def login(self, user, password):
        self._page.get_by_label("Username").fill(user)
        self._page.get_by_label("Password").fill(password)
        self._page.get_by_role("button", name="Sign in").click()


parser = argparse.ArgumentParser("login", fromfile_prefix_chars="@")
parser.add_argument("--url", default="http://127.0.0.1:8000/login.html")
parser.add_argument("--browser", type=str)
args = parser.parse_args()

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=args.browser, args=["--disable-gpu", "--window-size=1280,800"])
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(args.url)
    page.on("filechooser", lambda chooser: chooser.set_files("avatar.png"))
    LoginPage(page).login("grace", "hopper")
    expect(page).to_have_url(getattr(args, "url").rsplit("/", 1)[0] + "/welcome?user=grace")
    print(json.dumps({"ok": True, "t": time.time()}))
    browser.close()
"""
)

SAVER = (
    HEADER
    + """
import os
from datetime import date

URLS = ["http://127.0.0.1:8000/login.html", "http://127.0.0.1:8000/help.html"]
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.getenv("QVL_BROWSER"))
    page = browser.new_page()
    for n, url in enumerate(URLS):
        page.goto(url)
        page.screenshot(path=f"shots/{date.today()}-{n}.png", full_page=True)
        page.pdf(path=os.path.join("pdfs", f"page{n}.pdf"))
        print("saved", url)
    with page.expect_download() as info:
        page.get_by_text("Get").click()
    info.value.save_as(os.path.join("downloads", info.value.suggested_filename))
    browser.close()
"""
)


@pytest.mark.parametrize("source", [SCRAPER, FORM_FILLER, SAVER], ids=["scraper", "form-filler", "saver"])
def test_ordinary_scripts_pass(source):
    check_script(source)
    assert verdict(source).ok


def test_a_headed_browser_is_not_refused():
    check_script(SCRAPER.replace("p.chromium.launch(", "p.chromium.launch(headless=False, ", 1))  # runs headless inside


@pytest.mark.parametrize(
    "snippet",
    [
        "while True:\n    print('x')",  # the sandbox caps output and time
        "import sys\nfor i in range(10):\n    sys.stdout.write('x')",
        "print('x' * 10**9)",  # the sandbox caps memory
        "list(map(print, range(10**9)))",
        "def f(n):\n    print(n)\n    f(n + 1)\nf(0)",
        "data = open('/etc/passwd').read()",  # only the sandbox's own files are there
        "import argparse\nargparse.ArgumentParser('x', None, None, None, [], None, '-', '@')",
        "d = None\nd.save_as('.git/config')",  # kept nowhere: the copy-back refuses hidden names
        "page = None\npage.screenshot(path='.ssh/authorized_keys')",
        "page = None\npage.goto('file:///etc/passwd')",  # the host's files are not in the sandbox
        "g = (i for i in [1])\nb = g.gi_frame.f_builtins",  # reflection reaches nothing outside the sandbox
        "print('{0.__class__}'.format(1))",
    ],
)
def test_what_only_a_wall_can_hold_passes_the_lint(snippet):
    assert verdict(HEADER + snippet + "\n").ok


@pytest.mark.parametrize(
    "snippet, reason",
    [
        ("import os\nos.system('rm -rf /')", "os.system is not needed"),
        ("from os import system\nsystem('ls')", "os.system is not needed"),
        ("import subprocess\nsubprocess.run(['ls'])", "subprocess is not needed"),
        ("from subprocess import Popen", "subprocess is not needed"),
        ("import requests", "page.request.get"),
        ("import urllib.request", "page.request.get"),
        ("import socket", "socket"),
        ("import no_such_module_here", "not installed here"),
        ("eval('1+1')", "eval() is not needed"),
        ("exec('x = 1')", "exec() is not needed"),
        ("m = __import__('os')", "__import__() is not needed"),
        ("name = input('name? ')", "input() gets no answer"),
        ("p = None\np.chromium.connect_over_cdp('http://localhost:9222')", "launch a fresh one"),
        ("page = None\npage.screenshot(path='/tmp/x.png')", "relative path"),
        ("page = None\npage.pdf(path='../x.pdf')", "relative path"),
        ("d = None\nd.save_as('~/x.txt')", "relative path"),
        ("async def go():\n    pass", "async"),
        ("from playwright.async_api import async_playwright", "sync API"),
    ],
)
def test_advice_goes_back_with_a_reason(snippet, reason):
    source = HEADER + snippet + "\n"
    with pytest.raises(ScriptRejected) as info:
        check_script(source)
    message = str(info.value)
    assert reason in message, message
    assert message.startswith("Line ") and message.endswith(".") and "\n" not in message


def test_syntax_errors_and_non_playwright_scripts_are_rejected():
    assert not verdict("def broken(:\n").ok
    assert "not valid Python" in verdict("def broken(:\n").reason
    assert "lone surrogate" in verdict(HEADER + "x = '\ud800'\0\n").reason
    assert "Playwright" in verdict("print('hello')\n").reason
    assert "empty" in verdict("   \n").reason


def test_a_source_encoding_other_than_utf8_is_rejected():
    hidden = "x = 1  #+AAo-import os+AAo-print(os.listdir('/'))\n"
    for cookie in ("# coding: utf-7\n", "# -*- coding: latin-1 -*-\n"):
        assert "source encoding other than UTF-8" in verdict(cookie + HEADER + hidden).reason
    check_script("# -*- coding: utf-8 -*-\n" + HEADER + "print('{} of {:.1f} {name}'.format(1, 2.0, name='x'))\n")
