"""The script policy: model-written Playwright scripts that could harm the machine never run."""

from __future__ import annotations

import pytest

from qvl_agent.playwright.policy import ScriptRejected, check_script, verdict

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
        ("open('/tmp/x', 'w').write('owned')", "open() is not allowed"),
        ("open('/tmp/x', mode='a')", "open() is not allowed"),
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
        ("p = None\nflags = ['--utility-cmd-prefix=sh']\np.chromium.launch(args=flags)", "browser flag"),
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


GOOD_TYPED = (
    HEADER
    + """
import os
from playwright.sync_api import Page

BROWSER = os.getenv("QVL_BROWSER")


def sign_in(page: Page, name: str, tries: int | None = None) -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_role("button", name="Sign in", exact=True).click()


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=BROWSER or None, args=["--disable-gpu", "--no-first-run"])
    page = browser.new_page()
    page.goto(os.environ["START_URL"] if "START_URL" in os.environ else "http://127.0.0.1:8000/")
    sign_in(page, "grace")
    expect(page.get_by_text("Welcome")).to_be_visible()
    browser.close()
"""
)


def test_plain_annotations_environment_browsers_and_inline_flags_pass():
    check_script(GOOD_TYPED)


LAUNCH = "p = None\np.chromium.launch(executable_path={path})"
PARSER = (
    "import argparse, os\n"
    "parser = argparse.ArgumentParser()\n"
    "parser.add_argument('--browser', default=os.environ.get('QVL_BROWSER'))\n"
)


@pytest.mark.parametrize(
    "snippet, reason",
    [
        # string annotations are code that typing.get_type_hints runs
        ("import typing", "typing"),
        ("from typing import get_type_hints", "typing"),
        ("def f(x: \"__import__('os').system('id')\"):\n    pass", "annotations may only be plain names"),
        ("def f() -> 'os.system(1)':\n    pass", "annotations may only be plain names"),
        ("x: 'print(1)' = 1", "annotations may only be plain names"),
        # a flag list that stays trusted after it changed
        (
            "A = ['--no-first-run']\nA += ['--renderer-cmd' + '-prefix=sh']\np = None\np.chromium.launch(args=A)",
            "args=",
        ),
        (
            "A = ['--no-first-run']\nA.append('--renderer-cmd' + '-prefix=sh')\np = None\np.chromium.launch(args=A)",
            "args=",
        ),
        ("A = ['--no-first-run']\nA[0] = '--ren' + 'derer'\np = None\np.chromium.launch(args=A)", "args="),
        ("A = ['--no-first-run']\nB = A\nB.append('x')\np = None\np.chromium.launch(args=A)", "args="),
        ("A = ['--no-first-run']\nA = ['--x']\np = None\np.chromium.launch(args=A)", "args="),
        ("A = ['--no-first-run']\ndef f(A):\n    return A\np = None\np.chromium.launch(args=A)", "args="),
        ("p = None\np.chromium.launch(args=['--no-first-run', '--ren' + 'derer'])", "args="),
        ("p = None\np.chromium.launch(args=['--gpu-launcher=/bin/sh'])", "args="),
        # executable paths that are fixed after all
        (LAUNCH.format(path="'/bin/' + 'sh'"), "executable_path must come from --browser or QVL_BROWSER"),
        ("x = 'sh'\n" + LAUNCH.format(path="f'/bin/{x}'"), "executable_path must come from"),
        ("import os\n" + LAUNCH.format(path="os.environ.get('QVL_BROWSER', '/bin/sh')"), "executable_path"),
        ("B = '/bin/sh'\n" + LAUNCH.format(path="B"), "executable_path"),
        ("class C:\n    browser = '/bin/sh'\n" + LAUNCH.format(path="C.browser"), "executable_path"),
        (
            PARSER + "args = parser.parse_args()\nargs.browser = '/bin/sh'\n" + LAUNCH.format(path="args.browser"),
            "executable_path",
        ),
        (
            PARSER + "args = parser.parse_args(['--browser', '/bin/sh'])\n" + LAUNCH.format(path="args.browser"),
            "executable_path",
        ),
        (PARSER.replace("os.environ.get('QVL_BROWSER')", "'/bin/sh'"), "--browser argument's default"),
        (PARSER.replace("default=", "type=lambda s: '/bin/sh', default="), "may not set type="),
        ("import argparse\nargparse.ArgumentParser().add_argument('--x', dest='browser')", "dest="),
        ("import argparse\nargparse.ArgumentParser(argument_default='/bin/sh')", "argument_default="),
        ("import argparse\nargparse.ArgumentParser().set_defaults(browser='/bin/sh')", "set_defaults"),
        ("import argparse\nargparse.ArgumentParser().register('type', None, str)", "register"),
        ("import argparse\nargparse.Namespace(browser='/bin/sh')", "argparse.Namespace"),
        ("import sys\nsys.argv.append('--browser=/bin/sh')", "sys.argv may only be read"),
        ("import sys\nsys.argv[1:] = ['--browser', '/bin/sh']", "sys.argv may only be read"),
        ("from sys import argv", "sys.argv"),
        # the environment reaches Playwright's node driver and Chromium
        ("import os\nos.environ['NODE_OPTIONS'] = '--import=data:,x'", "os.environ may only be read"),
        ("import os\nos.environ.update({'CHROMIUM_FLAGS': 'x'})", "os.environ may only be read"),
        ("import os\ne = os.environ\ne['X'] = 'y'", "os.environ may only be read"),
        ("from os import environ", "os.environ"),
        # reading files that page.goto could send away
        ("data = open('/etc/passwd').read()", "open() is not allowed"),
        ("f = open\nf('/etc/passwd')", "open() is not allowed"),
        ("x = None\nx.read_text()", "read_text"),
        ("x = None\nx.read_bytes()", "read_bytes"),
        ("import argparse\nargparse.ArgumentParser(fromfile_prefix_chars='@')", "fromfile_prefix_chars="),
        # other ways to os or eval
        ("import re\nre.enum.sys.modules['os']", "re.enum"),
        ("import json\njson.decoder.re", "json.decoder"),
        ("from playwright.sync_api import playwright", "playwright.sync_api.playwright"),
        ("from playwright.sync_api import *", "import *"),
        ("g = (i for i in [1])\ng.gi_frame.f_builtins['eval']('1')", "f_builtins"),
        ("import string\nstring.Formatter().get_field('0.x', [1], {})", "string.Formatter"),
        ("import re\nre.compile = None", "changing a module"),
        ("p = None\np.chromium.launch(artifacts_dir='/tmp/x')", "artifacts_dir="),
        # attributes read by a class pattern or a format field, where no Attribute node shows them
        ("O = str.mro()[-1]\nmatch print:\n    case O(__self__=b):\n        pass", "class pattern may not name"),
        ("class C:\n    pass\nmatch C():\n    case C(system=run):\n        run('id')", "class pattern may not name"),
        ("print('{0.__class__.__init__.__globals__}'.format(print))", "reaches a private attribute"),
        ("print('{0:{1.__class__}}'.format(1, 2))", "reaches a private attribute"),
        ("print('{a._impl_obj}'.format_map({'a': 1}))", "reaches a private attribute"),
        ("t = '{0.__cl' + 'ass__}'\nprint(t.format(1))", "needs its format string written out"),
        ("print(str.format('{0.__class__}', 1))", "needs its format string written out"),
    ],
)
def test_policy_bypasses_are_rejected_with_a_reason(snippet, reason):
    message = verdict(HEADER + snippet + "\n")
    assert not message.ok
    full = str(pytest.raises(ScriptRejected, check_script, HEADER + snippet + "\n").value)
    assert reason in full, full
    assert full.startswith("Line ") and full.endswith(".") and "\n" not in full


def test_the_browser_comes_only_from_the_environment_or_the_parsed_browser_argument():
    for path in (
        "None",
        "os.environ['QVL_BROWSER']",
        "os.environ.get('QVL_BROWSER')",
        "os.getenv('QVL_BROWSER') or None",
        "os.environ.get('QVL_BROWSER', os.getenv('QVL_BROWSER'))",
        "args.browser or os.environ.get('QVL_BROWSER') or None",
    ):
        source = HEADER + PARSER + "args = parser.parse_args()\n" + LAUNCH.format(path=path) + "\n"
        assert verdict(source).ok, (path, verdict(source).reason)


@pytest.mark.parametrize(
    "snippet, reason",
    [
        # A module name is that module everywhere: a use above the import, rebinding in a loop or function.
        ("def f():\n    return os.system('id')\nimport os\nf()", "os.system"),
        ("import os\nfor os in [None]:\n    pass", "bound to an import and to something else"),
        ("import time\ndef f(time):\n    return time\n", "bound to an import and to something else"),
        ("import json as j\nj = __name__", "bound to an import and to something else"),
        ("import re\nimport os as re", "bound to an import and to something else"),
        # The launch-flag list reached through a dict or a parameter, then changed.
        (
            "A = ['--no-first-run']\ndef g(args):\n    args.append('--single-process')\ng(args=A)\n"
            "p = None\np.chromium.launch(args=A)",
            "args=",
        ),
        ("A = ['--no-first-run']\nd = dict(args=A)\np = None\np.chromium.launch(args=A)", "args="),
        (
            "A = ['--no-first-run']\nclass C:\n    def launch(self, args):\n        args.append('--x')\n"
            "C().launch(args=A)\np = None\np.chromium.launch(args=A)",
            "args=",
        ),
        # argparse reading files.
        ("import argparse\nparser = argparse.ArgumentParser('x', None, None, None, [], None, '-', '@')", "keyword"),
        ("import argparse\nparser = argparse.ArgumentParser(fromfile_prefix_chars='@')", "fromfile_prefix_chars"),
        ("import argparse\nparser = argparse.ArgumentParser()\nparser.fromfile_prefix_chars = '@'", "setting"),
        ("x = None\nx.convert_arg_line_to_args = print", "convert_arg_line_to_args"),
        # Playwright calls that read local files or send traffic elsewhere.
        ("page = None\npage.on('filechooser', lambda fc: fc.set_files('/etc/passwd'))", "set_files"),
        ("b = None\nb.new_context(storage_state='/root/state.json')", "storage_state"),
        ("b = None\nb.new_context(client_certificates=[{'origin': 'x', 'certPath': '/k'}])", "client_certificates"),
        ("p = None\np.chromium.launch(proxy={'server': 'http://evil:8080'})", "proxy"),
        ("p = None\nr = p.request.new_context()", ".request"),
        ("p = None\nr = p.request\nr.new_context()", ".request"),
        ("c = None\nc.tracing.start(name='../../.bashrc')", "tracing.start"),
        ("c = None\nc.tracing.start(name=__name__)", "tracing.start"),
        ("import os\np = None\np.chromium.launch(executable_path=os.environ['SHELL'])", "executable_path"),
        ("import os\np = None\np.chromium.launch(executable_path=os.getenv('EDITOR'))", "executable_path"),
        # Writing outside the scratch folder.
        ("page = None\npage.screenshot(path='/tmp/x.png')", "path="),
        ("page = None\npage.screenshot(path='../x.png')", "path="),
        ("page = None\npage.pdf(path='~/x.pdf')", "path="),
        ("page = None\nname = 'x.png'\npage.screenshot(path=name)", "path="),
        ("d = None\nd.save_as('/root/x.txt')", "save_as"),
        ("d = None\nname = 'x.txt'\nd.save_as(name)", "save_as"),
        ("d = None\nd.save_as('../x.txt')", "save_as"),
        # Printing without bound.
        ("while True:\n    print('x')", "printing inside a loop"),
        ("import sys\nfor i in range(10):\n    sys.stdout.write('x')", "printing inside a loop"),
        ("print('x' * 10**9)", "repeating"),
        ("n = 9\nprint('x' * n)", "repeating"),
        ("print(10 ** 10 ** 10)", "powers"),
    ],
)
def test_the_classes_that_got_through_are_closed(snippet, reason):
    full = str(pytest.raises(ScriptRejected, check_script, HEADER + snippet + "\n").value)
    assert reason in full, full
    assert full.startswith("Line ") and full.endswith(".") and "\n" not in full


def test_screenshots_and_pdfs_to_relative_paths_in_the_scratch_folder_pass():
    source = HEADER + (
        "import os\n"
        "with sync_playwright() as p:\n"
        "    browser = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'])\n"
        "    page = browser.new_page()\n"
        "    page.screenshot(path='shot.png')\n"
        "    page.screenshot(path='shots/after.png', full_page=True)\n"
        "    page.pdf(path='page.pdf')\n"
        "    with page.expect_download() as info:\n"
        "        page.get_by_text('Get').click()\n"
        "    info.value.save_as('downloads/report.txt')\n"
        "    print(page.request.get('http://127.0.0.1:8000/api').status)\n"
        "    print('-' * 40)\n"
        "    browser.close()\n"
    )
    assert verdict(source).ok, verdict(source).reason


def test_a_source_encoding_that_would_run_other_code_than_was_checked_is_rejected():
    # Under utf-7, '+AAo-' is a line break: Python would run `import os; print(os.listdir('/'))`.
    hidden = "x = 1  #+AAo-import os+AAo-print(os.listdir('/'))\n"
    for cookie in (
        "# coding: utf-7\n",
        "# -*- coding: latin-1 -*-\n",
        "#!/usr/bin/env python\n# vim: set fileencoding=utf_7 :\n",
    ):
        full = str(pytest.raises(ScriptRejected, check_script, cookie + HEADER + hidden).value)
        assert "source encoding other than UTF-8" in full, full
    check_script("# -*- coding: utf-8 -*-\n" + HEADER + "print('{} of {:.1f} {name}'.format(1, 2.0, name='x'))\n")
    check_script(HEADER + "match (1, 'a'):\n    case (int(), str() as s):\n        print(s)\n")
