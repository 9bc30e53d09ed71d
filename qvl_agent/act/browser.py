"""The browser executor: the agent's actions carried out in Chromium through Playwright's sync API.

The model sees the page's viewport, screenshotted in CSS pixels, so its 0-1000 coordinates map to CSS
pixels through `image.to_pixels` exactly as they map to screen pixels on the desktop. Clicks go through
the mouse, typing and keys through the keyboard (Qwen's key names mapped to Playwright's), scrolling
through the wheel, just as a person would do it. Before every pointer action `locate` resolves the element
under the point to a robust locator; it goes into `ActionResult.detail` (and so into the trace) together
with the element's state before and after (whether the page listens to key events there included) and
the point inside the element, which is what `export` compiles into a replayable script.

A dialog (alert, confirm, prompt, beforeunload) blocks its page until it is answered, and Playwright's
sync API runs the handler while the action that opened it is still in flight: every dialog of every tab
is answered on the spot by the callback the agent gave (`answer_dialogs_with`: one model turn), or
dismissed when there is none (the first page's load, before the run starts). None is accepted unasked.
Each one, with the answer, goes into the detail of the action in flight (`"dialogs"`, what `export`
expects before that step) and into that action's message, which the model reads next.

A browser that closes, a page that crashes or a page whose server stopped answering raise `BrowserError`
with one sentence; the run stops there and its trace stays complete.

With `playwright_trace=PATH` the context records Playwright's own trace (DOM snapshots, screenshots,
network, console) from the start, and `close()` saves it to PATH (`playwright show-trace PATH` opens it),
also after a failed or stopped run. The caller leaves it off for a run with a secret: the snapshots would
hold the typed value.

Playwright is imported when an executor is built, never at module import. The Playwright sync API is
bound to the thread that started it: build, use and close an executor on one thread.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from qvl_agent import actions as A
from qvl_agent.act.base import ActionResult, DialogAnswer
from qvl_agent.act.confine import HostProxy
from qvl_agent.act.dialogs import PageDialogs, answered
from qvl_agent.act.keys import PLAYWRIGHT, canonical
from qvl_agent.act.netguard import NetworkGuard, allowed_host
from qvl_agent.errors import ActionError, BrowserError, UsageError
from qvl_agent.image import Screenshot, load_image_bytes, to_pixels
from qvl_agent.playwright.chromium import find_browser
from qvl_agent.playwright.flags import CHROMIUM_ARGS
from qvl_agent.playwright.locate import (
    KEY_LISTENERS_JS,
    Located,
    element_state,
    focused,
    is_unique,
    item_of,
    locate,
    point_on,
    to_playwright,
)

DEFAULT_VIEWPORT = (1280, 800)
ACTION_TIMEOUT_MS = 10_000
QUIET_MS = 250  # the DOM must be unchanged this long (and no request in flight) to count as settled
BLOCK_NOTICE_MS = 300  # with --allow-domain: how long an action waits for a navigation it may start
WHEEL_NOTCH_PX = 100  # Chromium scrolls 100 CSS px per wheel notch
MAX_SCROLL_NOTCHES = 50

# Records when the DOM last changed, so `wait_until_settled` can wait for a quiet page.
_MUTATION_CLOCK = """(() => {
  window.__qvlLastChange = performance.now();
  new MutationObserver(() => { window.__qvlLastChange = performance.now(); })
    .observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
})();"""

CLOSE_EVENT_TRIES = 20  # 50 ms apart: how long a tab that closed under an action may take to say so
_CLOSED_MARKERS = ("has been closed", "Target closed", "Browser closed", "browser has disconnected")


def _says_closed(exc: Exception) -> bool:
    """Whether Playwright's error is about a page, context or browser that is gone."""
    return any(marker in str(exc) for marker in _CLOSED_MARKERS)


def playwright_key(keys: tuple[str, ...]) -> str:
    """Qwen's chord, e.g. ("ctrl", "a"), as Playwright's "Control+a"."""
    names = []
    for key in keys:
        # One printable character is itself; a control character ("\n") is no key name Playwright knows.
        name = key if len(key) == 1 and key.isprintable() else PLAYWRIGHT.get(canonical(key))
        if name is None:
            hint = "use names like enter, tab, ctrl, shift, up, f5 or one character"
            raise ActionError(f"Unknown key {key!r}; {hint}.")
        names.append(name)
    return "+".join(names)


def parse_viewport(text: str) -> tuple[int, int]:
    """ "1280x800" -> (1280, 800), or UsageError."""
    try:
        w, h = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"A viewport is WIDTHxHEIGHT in CSS pixels, like 1280x800, not {text!r}.") from None
    if not (200 <= w <= 7680 and 200 <= h <= 4320):
        raise UsageError(f"The viewport {text} is out of range (200x200 to 7680x4320).")
    return w, h


SCREENSHOT_TRIES = 2
# Chromium's words for a screenshot the moment made impossible, not the page: no frame painted yet, and a
# navigation swapping the page's document (and renderer) under the capture.
PASSING_SCREENSHOT = ("Unable to capture screenshot", "Not attached to an active page")

# With a proxy: WebRTC may use no UDP path the proxy does not carry (Playwright already sends loopback
# through the proxy too).
CONFINED_ARGS = ("--webrtc-ip-handling-policy=disable_non_proxied_udp", "--force-webrtc-ip-handling-policy")


class BrowserExecutor:
    """Carries out actions in one Chromium page. Opens `url` on construction; `close()` ends the browser."""

    name = "browser"

    def __init__(
        self,
        url: str,
        *,
        browser: str | None = None,
        configured_browser: str = "",
        headless: bool = True,
        viewport: tuple[int, int] = DEFAULT_VIEWPORT,
        allowed_domains: list[str] | tuple[str, ...] = (),
        secrets=None,
        block_local: bool = False,
        playwright_trace: str | Path | None = None,
    ):
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        from playwright.sync_api import sync_playwright

        self._error_type, self._timeout_type = PlaywrightError, PlaywrightTimeout
        self.start_url = url
        self.viewport = viewport
        self._inflight: set = set()
        self._dead = ""  # why the browser or page cannot be used any more
        self._page_closed = False
        self._watched: list = []
        self._failed_navigation = ""
        self._touched: list[tuple[object, Located]] = []  # (the page it is on, the element)
        self._text_before_last_click: str | None = None
        self._dialogs = PageDialogs(PlaywrightError)
        # --allow-domain: navigations to other hosts are aborted and reported with the next action's result;
        # secrets go to allowed hosts only; the MCP server keeps runs off local addresses (`netguard`).
        start_host = urlsplit(url).hostname
        self.allowed_domains = tuple(allowed_domains) + ((start_host,) if allowed_domains and start_host else ())
        self._guard = NetworkGuard(url, tuple(allowed_domains), secrets, block_local)
        self._blocked: list[str] = []
        self._last_url = url
        # With a secret in the run, the whole browser goes through a proxy that connects the allowed hosts
        # and nothing else (`confine`): whatever makes a request, and however it spells the secret.
        self._proxy = HostProxy(self._guard.secret_domains).start() if secrets else None
        self._pw = None
        self._trace_path = None  # set once tracing runs: where close() saves it
        try:
            self._pw = sync_playwright().start()
            bundled = self._pw.chromium.executable_path
            self.executable = find_browser(browser, configured_browser, bundled, headless=headless)
            confined = {"proxy": {"server": self._proxy.url}} if self._proxy else {}
            args = [*CHROMIUM_ARGS, *(CONFINED_ARGS if self._proxy else ())]
            try:
                # Ctrl+C is ours: Playwright's own handler would close the browser under the step in flight,
                # and the run would end as "browser closed" instead of interrupted, with its report.
                self.browser = self._pw.chromium.launch(
                    executable_path=self.executable, headless=headless, args=args, handle_sigint=False, **confined
                )
            except PlaywrightError as exc:
                why = _first_line(exc)
                raise BrowserError(f"Chromium ({self.executable}) did not start: {why}.") from None
            self.browser.on("disconnected", lambda _b: self._mark_dead("The browser closed during the run."))
            self.context = self.browser.new_context(
                viewport={"width": viewport[0], "height": viewport[1]},
                # A service worker's requests would not pass the guard's route.
                service_workers="block" if self._guard.active else "allow",
            )
            self.context.set_default_timeout(ACTION_TIMEOUT_MS)
            if playwright_trace is not None:
                self.keep_playwright_trace(playwright_trace)
            self.context.add_init_script(_MUTATION_CLOCK)
            self.context.add_init_script(KEY_LISTENERS_JS)
            self.context.on("page", self._adopt)
            self.context.on("dialog", self._dialogs.on_dialog)  # every tab's, also one opened later
            if self._guard.active:
                self.context.route("**/*", self._guard.handle)
            self.page = self.context.new_page()
            self._watch(self.page)
            try:
                self.page.goto(url, wait_until="load")
            except PlaywrightError as exc:
                raise BrowserError(f"The page {url} could not be opened: {_first_line(exc)}.") from None
            self.wait_until_settled(5.0)
        except BaseException:
            self.close()
            raise

    # --- page life ------------------------------------------------------------------------------------

    def _mark_dead(self, why: str) -> None:
        self._dead = self._dead or why

    def _watch(self, page) -> None:
        if any(page is seen for seen in self._watched):
            return  # the context's "page" event also reports the first page
        self._watched.append(page)
        page.on("crash", lambda _p: self._mark_dead("The page crashed during the run."))
        page.on("close", lambda p: self._on_close(p))
        page.on("request", lambda r: self._inflight.add(r))
        page.on("requestfinished", lambda r: self._inflight.discard(r))
        page.on("requestfailed", self._on_request_failed)

    def keep_playwright_trace(self, path: str | Path) -> None:
        """Record Playwright's trace from now on (DOM snapshots, screenshots, network, console); `close()`
        saves it to `path`."""
        try:
            self.context.tracing.start(screenshots=True, snapshots=True)
        except self._error_type as exc:
            self._fail(exc)
        self._trace_path = Path(path)

    def answer_dialogs_with(self, answer: DialogAnswer | None) -> list[dict]:
        """Answer each dialog from now on through `answer` (None: dismiss); returns those dismissed so far."""
        return self._dialogs.answer_with(answer)

    @property
    def dialog_answer(self) -> DialogAnswer | None:
        """What answers the page's dialogs now (`answer_dialogs_with`)."""
        return self._dialogs.answer

    def _adopt(self, page) -> None:
        """A link that opens a new tab: the run follows it, as a person would."""
        self._watch(page)
        self.page = page

    def _tab(self) -> int:
        """Which of the run's pages the current one is: 0 the first, then in the order they opened."""
        return next((i for i, seen in enumerate(self._watched) if seen is self.page), 0)

    def _on_close(self, page) -> None:
        if page is self.page:
            others = [p for p in self.context.pages if not p.is_closed()]
            if others:
                self.page = others[-1]
            else:
                self._page_closed = True  # the page alone, or the whole browser: `_check_alive` tells

    def _on_request_failed(self, request) -> None:
        self._inflight.discard(request)
        try:
            if request.is_navigation_request() and request.frame == request.frame.page.main_frame:
                self._failed_navigation = f"{request.url} ({request.failure})"
        except self._error_type:
            pass

    def _check_alive(self) -> None:
        if self._page_closed and not self._dead:
            gone = not self.browser.is_connected()
            self._mark_dead(f"The {'browser' if gone else 'page'} closed during the run.")
        if self._dead:
            raise BrowserError(self._dead)
        if host := self._off_allowed_domains():
            self._blocked.append(host)  # told with the next action's result
            self._leave_error_page(self._last_url)
        if (
            self.page.url.startswith("chrome-error://")
            and self._guard.active
            and ("BLOCKED_BY_CLIENT" in self._failed_navigation or self._blocked)
        ):
            # A navigation --allow-domain blocked: not a dead page. A tab that opened only to be refused (its
            # request may come before the tab is watched, on a busy machine) is closed; a page is taken back.
            if not self._close_refused_tab():
                self._leave_error_page(self._last_url)
        if self.page.url.startswith("chrome-error://"):
            what = self._failed_navigation or "the server did not answer"
            self._mark_dead(f"The page stopped answering: loading {what} failed.")
            raise BrowserError(self._dead)

    def _closed_under_its_action(self, page, exc: Exception) -> bool:
        """Whether the tab the action was in closed under it (a popup that closes itself as it is sent, on a
        busy machine before the click's last event was acknowledged) while the browser and another tab of
        the run live on: then the action happened, and the run goes on in the tab left open."""
        others = [other for other in self._watched if other is not page and not other.is_closed()]
        if self._dead or not others or not _says_closed(exc) or not self.browser.is_connected():
            return False
        for _ in range(CLOSE_EVENT_TRIES):  # the tab's close event may come just after the error
            if page.is_closed():
                if self.page is page or self.page.is_closed():
                    self.page = others[-1]
                self._page_closed = False
                return True
            others[-1].wait_for_timeout(50)
        return False

    def _fail(self, exc: Exception) -> None:
        """Turn a Playwright error into BrowserError (browser gone) or ActionError (fed to the model)."""
        if self._dead or _says_closed(exc):
            self._mark_dead("The browser closed during the run.")
            raise BrowserError(self._dead) from None
        raise ActionError(f"The browser could not do that: {_first_line(exc)}.") from None

    # --- Executor protocol ----------------------------------------------------------------------------

    def observe(self) -> Screenshot:
        """The viewport in CSS pixels (so 0-1000 model coordinates map to CSS pixels)."""
        self._check_alive()
        try:
            png = self.png(self.page, animations="disabled")
        except self._error_type as exc:
            self._fail(exc)
        shot = load_image_bytes(png, name="page screenshot")
        return Screenshot(shot.data, shot.width, shot.height, shot.layout, source=f"browser:{self.page.url}")

    def png(self, page, **options) -> bytes:
        """`page` as a PNG in CSS pixels. A busy machine's Chromium may answer "Unable to capture screenshot"
        for a frame not yet painted, or paint none in time, and a page whose next document is being swapped
        in is "Not attached": the next try, once that document has loaded, gets one. Playwright's error for
        anything else, or for the second try."""
        for attempt in range(SCREENSHOT_TRIES):
            try:
                return page.screenshot(scale="css", type="png", caret="initial", **options)
            except self._error_type as exc:
                passing = isinstance(exc, self._timeout_type) or any(s in str(exc) for s in PASSING_SCREENSHOT)
                if attempt + 1 == SCREENSHOT_TRIES or not passing:
                    raise
                try:
                    page.wait_for_load_state("load", timeout=options.get("timeout"))
                except self._error_type:
                    pass  # a page still loading is shot as it is

    def wait_until_settled(self, timeout_s: float) -> None:
        """Wait for the load event, no request in flight and a DOM unchanged for QUIET_MS (or timeout_s)."""
        if self._dead:
            return
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            self.page.wait_for_load_state("load", timeout=max(timeout_s, 0.001) * 1000)
        except self._error_type:
            pass  # a page still loading after the timeout is observed as it is
        while time.monotonic() < deadline and not self._dead:
            try:
                quiet = self.page.evaluate("() => performance.now() - (window.__qvlLastChange || 0)")
            except self._error_type:
                quiet = 0  # the page is navigating: its next document has not started yet
            if quiet >= QUIET_MS and not self._inflight:
                return
            try:
                self.page.wait_for_timeout(50)
            except self._error_type:
                return

    def execute(self, action: A.Action, shot: Screenshot) -> ActionResult:
        self._check_alive()
        earlier = len(self._blocked)  # hosts blocked before this action (a late redirect) are not its doing
        start_page, tabs_before = self.page, len(self._watched)
        detail: dict = {"url": self.page.url}
        if self._tab():  # the exporter follows the run into a tab it opened (or back)
            detail["tab"] = self._tab()
        self._last_url = detail["url"]
        self._dialogs.acting = A.describe(action)
        try:
            self._perform(action, shot, detail)
        except self._error_type as exc:
            if not self._closed_under_its_action(start_page, exc):
                self._fail(exc)
        finally:
            opened = self._dialogs.end_action()
        message = "done"
        if opened:  # what export expects before this step, and what the model reads next
            detail["dialogs"] = opened
            message += "".join(f"; {answered(d)}" for d in opened)
        if self._guard.active:
            try:
                self.page.wait_for_timeout(BLOCK_NOTICE_MS)  # lets a navigation the action started reach the route
            except self._error_type:
                pass
            if any(self.page is page for page in self._watched[tabs_before:]):
                try:  # a tab this action opened: its navigation reaches the route (or loads) first
                    self.page.wait_for_load_state("load", timeout=BLOCK_NOTICE_MS * 10)
                except self._error_type:
                    pass
            if host := self._off_allowed_domains():
                self._blocked.append(host)
        notes, refused = list(self._guard.blocked), list(self._guard.refused_navigations)
        if self._proxy and (confined := sorted(set(self._proxy.take_refused()))):
            notes.append(
                f"the page tried to reach {', '.join(confined)}; while a secret is in the run the browser reaches "
                "only the allowed domains, so that was blocked"
            )
        self._guard.blocked.clear()
        self._guard.refused_navigations.clear()
        if self._blocked[earlier:] or refused:  # the export leaves this action out: where it led was refused
            detail["blocked"] = sorted(set(self._blocked[earlier:] + refused))
        if self._blocked:
            hosts = ", ".join(sorted(set(self._blocked)))
            notes.append(f"the page tried to open {hosts}, which is not an allowed domain: that was blocked")
        if self._blocked or refused:
            self._blocked.clear()
            if not self._close_blocked_tab(start_page, tabs_before):
                self._leave_error_page(detail["url"])
        elif notes:
            self._leave_error_page(detail["url"])
        message += "".join(f"; {note}" for note in notes)
        self._check_alive()
        return ActionResult(True, message, detail)

    def _close_refused_tab(self) -> bool:
        """Close the current tab when it is not the first and shows the error page of a refused navigation."""
        if self.page is self._watched[0] or not self.page.url.startswith("chrome-error://"):
            return False
        refused = self.page
        back = next((p for p in reversed(self._watched) if p is not refused and not p.is_closed()), None)
        if back is None:
            return False
        try:
            refused.close()
        except self._error_type:
            pass
        self.page, self._page_closed = back, False
        return True

    def _close_blocked_tab(self, start_page, tabs_before: int) -> bool:
        """A tab this action opened only to be refused (a link with target=_blank to another host) is closed
        and the run stays where it was, so the action had no effect at all (the export leaves it out)."""
        if not any(self.page is page for page in self._watched[tabs_before:]) or start_page.is_closed():
            return False
        try:
            self.page.close()
        except self._error_type:
            pass
        self.page = start_page
        self._page_closed = False
        return True

    def _off_allowed_domains(self) -> str:
        """The page's host when it is on one that --allow-domain does not allow, else "". The route blocks a
        navigation's first request, but Playwright never shows it the hops of a server's redirect: an open
        redirect on an allowed site would lead anywhere. So where the page ended up is checked too."""
        url = self.page.url
        host = urlsplit(url).hostname or ""
        if (
            self.allowed_domains
            and url.startswith(("http:", "https:"))
            and not allowed_host(host, self.allowed_domains)
        ):
            return host
        return ""

    def _leave_error_page(self, url: str) -> None:
        """Chromium shows an error page for a blocked navigation, and a redirect may have reached a host that
        is not allowed: go back to where the action started."""
        try:
            self.page.wait_for_load_state("load", timeout=2000)
            if self.page.url.startswith("chrome-error://") or self._off_allowed_domains():
                self.page.goto(url, wait_until="load")
                self._failed_navigation = ""
        except self._error_type:
            pass

    def close(self) -> None:
        if self._trace_path is not None:
            path, self._trace_path = self._trace_path, None
            try:
                self.context.tracing.stop(path=str(path))
                os.chmod(path, 0o600)  # private like the rest of the run folder
            except (self._error_type, OSError):
                pass  # the browser died with the run: there is no trace to save
        for step in (lambda: self.browser.close(), lambda: self._pw.stop(), lambda: self._proxy.close()):
            try:
                step()
            except Exception:  # already gone: closing twice or after a crash is fine
                pass

    def validate(self, action: A.Action) -> None:
        """ActionError when Playwright cannot press what `action` asks; the dry run asks too."""
        if isinstance(action, A.Key):
            playwright_key(action.keys)

    # --- actions --------------------------------------------------------------------------------------

    def _target(self, x: float, y: float, shot: Screenshot, detail: dict) -> tuple[int, int, Located]:
        px, py = to_pixels(x, y, shot)
        located = locate(self.page, px, py)
        detail.setdefault("pixels", []).append([px, py])
        detail.setdefault("locator", located.locator)
        detail.setdefault("element", located.element)
        if located.handle is not None and located.locator["kind"] != "point":
            self._touched.append((self.page, located))
            if "offset" not in detail:  # where inside the element: the replay acts at the run's own point
                detail.update(point_on(located.handle, px, py))
        return px, py, located

    def _keyboard_target(self, detail: dict) -> Located | None:
        located = focused(self.page)
        if located is not None:
            detail["locator"] = located.locator
            detail["element"] = located.element
            detail["before"] = element_state(located.handle)
            self._touched.append((self.page, located))
        return located

    def _perform(self, action: A.Action, shot: Screenshot, detail: dict) -> None:
        mouse, keyboard = self.page.mouse, self.page.keyboard
        if isinstance(action, A.LeftClick | A.RightClick | A.MiddleClick | A.DoubleClick | A.TripleClick):
            self._text_before_last_click = self._page_text()
            px, py, located = self._target(action.x, action.y, shot, detail)
            detail["before"] = element_state(located.handle)
            button = {"right_click": "right", "middle_click": "middle"}.get(action.kind, "left")
            count = {"double_click": 2, "triple_click": 3}.get(action.kind, 1)
            mouse.click(px, py, button=button, click_count=count)
            detail["after"] = element_state(located.handle)
        elif isinstance(action, A.MouseMove):
            px, py, _ = self._target(action.x, action.y, shot, detail)
            mouse.move(px, py)
        elif isinstance(action, A.LeftClickDrag):
            if action.start_x is not None and action.start_y is not None:
                sx, sy, _ = self._target(action.start_x, action.start_y, shot, detail)
                mouse.move(sx, sy)
            ex, ey = to_pixels(action.x, action.y, shot)
            detail.setdefault("pixels", []).append([ex, ey])
            end = locate(self.page, ex, ey)
            detail["end_locator"] = end.locator
            if end.handle is not None and end.locator["kind"] != "point":
                detail["end_element"] = end.element
                detail["end_offset"] = point_on(end.handle, ex, ey).get("offset")
            mouse.down()
            mouse.move(ex, ey, steps=10)
            mouse.up()
        elif isinstance(action, A.Type):
            located = self._keyboard_target(detail)
            keyboard.type(action.text)
            detail["text"] = action.text
            detail["after"] = element_state(located.handle) if located else None
        elif isinstance(action, A.Key):
            located = self._keyboard_target(detail)
            detail["keys"] = playwright_key(action.keys)
            keyboard.press(detail["keys"])
            detail["after"] = element_state(located.handle) if located else None
        elif isinstance(action, A.Scroll | A.HScroll):
            if action.x is not None and action.y is not None:
                px, py, _ = self._target(action.x, action.y, shot, detail)
                mouse.move(px, py)
            # Qwen counts wheel notches (positive = up/right), as the desktop executor does.
            amount = max(-MAX_SCROLL_NOTCHES, min(MAX_SCROLL_NOTCHES, round(action.pixels))) * WHEEL_NOTCH_PX
            dx, dy = (amount, 0) if isinstance(action, A.HScroll) else (0, -amount)
            mouse.wheel(dx, dy)
            detail["wheel"] = [dx, dy]
        # A.Wait never gets here: the agent sleeps through its guard, which the emergency stop wakes.

    def aria_snapshot(self, limit: int = 12_000) -> str:
        """The page's accessibility tree as Playwright's ARIA snapshot (YAML), cut to `limit` characters."""
        self._check_alive()
        try:
            snapshot = self.page.locator("body").aria_snapshot()
        except self._error_type as exc:
            self._fail(exc)
        return snapshot if len(snapshot) <= limit else snapshot[:limit] + "\n# ... (cut)"

    # --- the end state, for the export's final assertions -----------------------------------------------

    def _page_text(self) -> str:
        try:
            return self.page.evaluate("() => document.body ? document.body.innerText : ''")
        except self._error_type:
            return ""

    def final_state(self) -> dict:
        """What the page shows now: URL, which tab it is, the state of every element the run touched on it
        that is still there and unique, and short lines of text that appeared after the last click. Checked
        in the live page, so `export` only asserts what holds."""
        self._check_alive()
        fields, gone, seen = [], [], set()
        for page, located in reversed(self._touched):
            if page is not self.page:
                continue  # an element in another tab: the script's end-state checks look at this one
            key = repr(sorted(located.locator.items()))
            if key in seen:
                continue
            seen.add(key)
            if located.locator.get("kind") == "within":  # the row it acted in: still there, or gone?
                item = item_of(located.locator)
                try:
                    if item not in gone and to_playwright(self.page, item).count() == 0:
                        gone.append(item)
                except self._error_type:
                    pass  # a page in the middle of navigating: no verdict, no check
            state = element_state(located.handle)
            if state and ("value" in state or "checked" in state) and is_unique(self.page, located.locator):
                fields.append({"locator": located.locator, "state": state})
        new_text = []
        if self._text_before_last_click is not None:
            before = {line.strip() for line in self._text_before_last_click.splitlines()}
            for line in self._page_text().splitlines():
                line = line.strip()
                if 3 <= len(line) <= 80 and line not in before and line not in new_text:
                    try:
                        loc = to_playwright(self.page, {"kind": "text", "text": line})
                        if loc.count() == 1 and loc.is_visible():
                            new_text.append(line)
                    except self._error_type:
                        pass
                if len(new_text) == 3:
                    break
        final = {"url": self.page.url, "fields": fields[::-1], "new_text": new_text, "gone": gone[::-1]}
        if self._tab():
            final["tab"] = self._tab()
        return final


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__
