"""Playwright's own trace of a replayed script: a hook `init_in_sandbox.py` runs before the script
(qvl-agent never imports it; inside the sandbox only the standard library and Playwright exist).

Every browser context the script makes (`new_context`, `new_page`, `launch_persistent_context`) records a
trace from its start: DOM snapshots, screenshots, network and console. It is saved as `trace.zip` in the
script's working folder (`trace-2.zip`, ... for more contexts) when the context, its page (a page that
made its own context), its browser or Playwright closes, so it comes back with the files the script
wrote (`copy_back.keep_files` keeps a .zip) and `playwright show-trace` opens it.

Nothing here is a wall: the script could stop the tracing and gain nothing by it.
"""

from __future__ import annotations

import os

from playwright.sync_api._context_manager import PlaywrightContextManager
from playwright.sync_api._generated import Browser, BrowserContext, BrowserType, Page, Playwright

FOLDER = os.getcwd()  # the scratch folder: the script may change directory, its files are sent from here
_tracing: list = []  # contexts recording now
_own_page: list = []  # contexts made by Browser.new_page: closing their page closes them
_saved = [0]


def _start(context, own_page: bool = False) -> None:
    try:
        context.tracing.start(screenshots=True, snapshots=True)
    except Exception:  # noqa: BLE001 (a trace is a bonus: the script runs on without one)
        return
    _tracing.append(context)
    if own_page:
        _own_page.append(context)


def _save(context) -> None:
    if not any(c is context for c in _tracing):
        return
    _tracing[:] = [c for c in _tracing if c is not context]
    _saved[0] += 1
    name = "trace.zip" if _saved[0] == 1 else f"trace-{_saved[0]}.zip"
    try:
        context.tracing.stop(path=os.path.join(FOLDER, name))
    except Exception:  # noqa: BLE001 (the browser is gone: nothing to save)
        pass


def _after(make, own_page: bool = False):
    def wrapped(*args, **kwargs):
        made = make(*args, **kwargs)
        _start(made.context if own_page else made, own_page)
        return made

    return wrapped


def _before(close, contexts):
    def wrapped(self, *args, **kwargs):
        for context in contexts(self):
            _save(context)
        return close(self, *args, **kwargs)

    return wrapped


def install() -> None:
    Browser.new_context = _after(Browser.new_context)
    Browser.new_page = _after(Browser.new_page, own_page=True)
    BrowserType.launch_persistent_context = _after(BrowserType.launch_persistent_context)
    BrowserContext.close = _before(BrowserContext.close, lambda context: [context])
    Browser.close = _before(Browser.close, lambda browser: [c for c in _tracing if c.browser is browser])
    Page.close = _before(Page.close, lambda page: [c for c in _own_page if c is page.context and len(c.pages) <= 1])
    Playwright.stop = _before(Playwright.stop, lambda _playwright: list(_tracing))  # sync_playwright().start()
    exit_ = PlaywrightContextManager.__exit__

    def on_exit(self, *args):
        for context in list(_tracing):
            _save(context)
        return exit_(self, *args)

    PlaywrightContextManager.__exit__ = on_exit


install()
