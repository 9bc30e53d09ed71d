"""The healing hook inside the sandbox (loaded by `init_in_sandbox.py` for `replay --heal`; qvl-agent never
imports it: inside the sandbox only the standard library, Playwright and this folder's `locate.py` exist).

`install(socket_path, script_path, locate_path, probe_ms)` wraps Playwright's sync Locator actions (click,
fill, check, select_option, press, ...) and its locator `expect` assertions. When one of them, called from
the script, fails because its locator no longer fits the page, the step is healed instead of failing:

  - what counts as broken: no element within `probe_ms` (the page is given until its network is idle to show
    it late), two or more elements (strict-mode violation), a click that another element intercepts (a
    banner covering the page), a failed `expect` whose locator matches no element or several (an `expect`
    on one element whose value differs is a real failure and stays one; a text check is never healed, its
    text is the check), and a CSS-path locator whose element no longer follows the caption the step
    recorded (`near`: two fields that swapped places);
  - which step: the calling frame's line in the script; its intent is the `# intent:` comment right above
    the step's code, or the one whose recorded locator is the failing one (the end-state checks);
  - the question: a screenshot (CSS pixels) and the intent go over the unix socket to qvl-agent outside,
    which asks the model and answers with a point, or with a sentence to stop on;
  - the answer: the element at that point (`document.elementFromPoint`, then `locate.py`'s most stable
    unique locator). It must have the role the step's intent names (for a covering banner: be a button or
    link inside the layer that covers the target), else the replay stops with one sentence. Outside is
    told what was found before the step goes on, so nothing is healed silently;
  - the step then runs on the new locator (a covering layer gets a locator handler that dismisses it
    whenever it shows, and the step runs again through the hook), and a locator healed once is reused for
    the same locator later in the script without asking again;
  - a point that lands on a layer over the page (the step's element gone *and* a banner on top) first
    closes the layer, then asks about the step again from a new screenshot.

Nothing here is a wall: the script could undo the wrapping and gain nothing by it. The host treats
everything that arrives over the socket as untrusted.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
import json
import re
import socket
import sys
import time
import tokenize

ACTIONS = (
    "click", "dblclick", "tap", "hover", "focus", "fill", "clear", "type", "press", "press_sequentially",
    "check", "uncheck", "set_checked", "select_option", "select_text", "set_input_files", "drag_to",
    "inner_text", "text_content", "input_value", "get_attribute",
)  # fmt: skip
COVER_ROLES = ("button", "link", "menuitem")  # what dismisses a covering layer
MAX_COVERS = 5  # layers dismissed in one replay before it stops: a page that covers itself for ever
SAME_ROLES = {"searchbox": "textbox", "listbox": "combobox"}  # roles that are the same kind of control
ANSWER_BYTES = 1 << 16


class HealStopped(AssertionError):
    """A step that could not be healed with confidence; the replay stops with this sentence (an AssertionError,
    so an exported script reports it the way it reports a failed check)."""


def _playwright_error():
    from playwright.sync_api import Error

    return Error


class _Channel:
    """One JSON object per line each way, over the unix socket to qvl-agent outside."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")

    def ask(self, message: dict) -> dict:
        self.sock.sendall(json.dumps(message).encode() + b"\n")
        line = self.reader.readline(ANSWER_BYTES)
        if not line:
            raise HealStopped("qvl-agent stopped answering, so the replay stops here.")
        return json.loads(line)


class _State:
    def __init__(self, channel: _Channel, script: str, locate, probe_ms: float):
        self.channel = channel
        self.script = script
        self.locate = locate
        self.probe_ms = probe_ms
        self.busy = False  # set while healing: the hook's own Playwright calls are never healed
        self.healed: dict[str, dict] = {}  # failing selector -> {"locator", "step"}
        self.covers = 0  # covering layers dismissed so far
        self.lines, self.intents = _read_intents(script)


def _read_intents(script: str) -> tuple[list[str], dict[int, dict]]:
    """The script's lines and its `# intent:` comments by line number (comments only: tokenize knows)."""
    try:
        with open(script, encoding="utf-8") as f:
            source = f.read()
    except OSError:
        return [], {}
    intents: dict[int, dict] = {}
    kinds: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                kinds.setdefault(tok.start[0], "comment")
                if tok.string.startswith("# intent: "):
                    try:
                        found = json.loads(tok.string[len("# intent: ") :])
                    except ValueError:
                        continue
                    if isinstance(found, dict):
                        intents[tok.start[0]] = found
            elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                kinds[tok.start[0]] = "code"
    except (tokenize.TokenError, SyntaxError):
        return [], {}
    return [kinds.get(n, "blank") for n in range(max(kinds, default=0) + 1)], intents


def _selector(locator) -> str:
    return getattr(locator._impl_obj, "_selector", "")


def _own_intent(state: _State, line: int) -> dict | None:
    """The intent comment right above the step's code (only code between them), or None."""
    for n in range(min(line, len(state.lines)) - 1, 0, -1):
        if n in state.intents:
            return state.intents[n]
        if state.lines[n] != "code":
            break
    return None


def _intent_for(state: _State, line: int, selector: str, page) -> dict | None:
    """The step's intent: the comment right above its code (only code between them). Else, for the
    end-state checks at the bottom, the intent that recorded exactly this locator."""
    own = _own_intent(state, line)
    if own is not None:
        return own
    same = []
    for n, intent in state.intents.items():
        try:
            built = state.locate.to_playwright(page, intent["locator"]) if intent.get("locator") else None
        except (KeyError, TypeError, ValueError):
            built = None
        if built is not None and _selector(built) == selector:
            same.append((n, intent))
    above = [i for n, i in same if n < line]
    return (above or [i for _, i in same] or [None])[-1]


def _intent_from_selector(selector: str) -> dict:
    """What a locator without an intent comment says about its element (model-written scripts)."""
    m = re.match(r'internal:role=(\w+)(?:\[name="((?:[^"\\]|\\.)*)"[si]?\])?', selector)
    if m:
        return {"role": m.group(1), "name": json.loads(f'"{m.group(2) or ""}"')}
    m = re.match(r'internal:(label|text|attr=\[placeholder)=?"((?:[^"\\]|\\.)*)"', selector)
    if m:
        return {"name": json.loads(f'"{m.group(2)}"')}
    return {}


def _script_frame(script: str):
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename != script:
        frame = frame.f_back
    return frame


def _where(frame) -> dict:
    """The line and the end of the call being made in `frame` (Python 3.11 instruction positions); the
    end identifies the call's node in the script's syntax tree."""
    positions = list(frame.f_code.co_positions())
    start, end_line, _, end_col = positions[frame.f_lasti // 2]
    return {"line": frame.f_lineno, "end_line": end_line or start, "end_col": end_col or 0}


def _role_of(state: _State, page, element: dict) -> str:
    role, _ = state.locate._role_and_name(page, element["css"]) if element.get("css") else ("", "")
    if role and role not in ("generic", "text", "paragraph"):
        return role
    tag, kind = element.get("tag", ""), element.get("type", "")
    if tag == "input":
        return {"checkbox": "checkbox", "radio": "radio", "number": "spinbutton", "range": "slider"}.get(
            kind, "button" if kind in ("button", "submit", "reset", "image") else "textbox"
        )
    return {"button": "button", "a": "link", "textarea": "textbox", "select": "combobox"}.get(tag, "")


def _near_of(locate, page, selector: str) -> str | None:
    """The caption (`near`) of the one element a CSS selector matches now; None unless exactly one."""
    try:
        loc = page.locator(selector)
        if loc.count() != 1:
            return None
        return loc.evaluate(locate.NEAR_JS)
    except Exception:  # the page navigated under the check: no verdict
        return None


def _is_css(selector: str) -> bool:
    return bool(selector) and not selector.startswith("internal:") and ">>" not in selector


class _Covered(Exception):
    """The model pointed at the step's element, but a layer over the page (a banner) lies on top of it."""

    def __init__(self, point: tuple[float, float]):
        super().__init__("covered")
        self.point = point


def _heal(
    state: _State, locator, method: str, error: str, where: dict, intent: dict | None, kind: str, at=None
) -> dict:
    """Ask outside for a point, resolve it, check it against the intent; the new locator dict. A "cover" heal
    checks the picked button against the layer over the target (or over the point `at`, when the target is
    gone too). Raises _Covered when a locate heal's point lies under such a layer."""
    page = locator.page
    intent = dict(intent or _intent_from_selector(_selector(locator)))
    started = time.perf_counter()
    cover: dict = {}
    png = page.screenshot(scale="css", type="png")
    view = page.viewport_size or {"width": 0, "height": 0}
    answer = state.channel.ask(
        {"type": "heal", "kind": kind, "intent": intent, "method": method, "failing": _selector(locator),
         "error": error[:400], "where": where, "viewport": [view["width"], view["height"]],
         "png": base64.b64encode(png).decode("ascii")}
    )  # fmt: skip
    if "stop" in answer:
        raise HealStopped(str(answer["stop"]))
    x, y = float(answer["point"][0]), float(answer["point"][1])
    found = state.locate.locate(page, x, y)
    element = found.element or {}
    role = _role_of(state, page, element) if found.locator.get("kind") != "point" else ""
    want = intent.get("role", "")
    problem = ""
    if found.locator.get("kind") == "point":
        problem = "there is no element there that a locator can name"
    elif kind == "cover":
        try:
            if at is None:
                cover = page.evaluate(_COVER_JS, [found.handle, locator.element_handle(timeout=1000)])
            else:
                cover = page.evaluate(_COVER_AT_JS, [found.handle, list(at)])
        except Exception:  # the target left the page meanwhile: nothing to tell it apart from
            cover = {"inside": False, "text": ""}
        if role not in COVER_ROLES or not cover["inside"]:
            where_ = "on" if cover["inside"] else "outside"
            problem = f"that is {_a(role)} {where_} the layer covering the page, not a button that closes it"
    elif want and SAME_ROLES.get(role, role) != SAME_ROLES.get(want, want):
        problem = f"that is {_a(role)}, not {_a(want)}"
    elif (
        not want
        and role in ("textbox", "checkbox", "radio", "combobox", "slider", "spinbutton")
        and method in ("click", "dblclick", "tap", "hover")
    ):
        problem = f"that is {_a(role)}, and the step clicked no form field"
    covered = False
    if problem and kind == "locate":
        try:
            covered = bool(page.evaluate(_COVER_AT_JS, [None, [x, y]]).get("layer"))
        except Exception:
            covered = False
    reply = state.channel.ask(
        {"type": "resolved", "point": [x, y], "locator": found.locator, "role": role, "problem": problem,
         "cover": cover, "covered": covered, "ms": (time.perf_counter() - started) * 1000}
    )  # fmt: skip
    if "stop" in reply:
        raise HealStopped(str(reply["stop"]))
    if reply.get("cover") is True:
        raise _Covered((x, y))
    return found.locator


def _a(role: str) -> str:
    if not role:
        return "an element without a role"
    return ("an " if role[0] in "aeiou" else "a ") + role


# Whether the picked element lies in the layer covering the target: the outermost ancestor of what is hit at
# the target's centre that does not hold the target itself. Returns that layer's text (for the report) too.
_COVER_JS = """
([picked, target]) => {
  const r = target.getBoundingClientRect();
  let layer = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  if (!layer || layer === target || target.contains(layer)) return {inside: false, text: ''};
  while (layer.parentElement && layer.parentElement !== document.body && !layer.parentElement.contains(target)) {
    layer = layer.parentElement;
  }
  const text = (layer.innerText || '').replace(/\\s+/g, ' ').trim().slice(0, 120);
  return {inside: !!picked && layer.contains(picked), text};
}
"""


# The layer over a point: the nearest fixed-position ancestor of what is hit there that covers a good part of
# the viewport (a banner, a consent wall, a modal's backdrop), and whether the picked element is inside it.
_COVER_AT_JS = """
([picked, [x, y]]) => {
  let layer = document.elementFromPoint(x, y);
  const area = innerWidth * innerHeight;
  while (layer && layer !== document.body) {
    const cs = getComputedStyle(layer), r = layer.getBoundingClientRect();
    if ((cs.position === 'fixed' || cs.position === 'sticky') && r.width * r.height >= 0.3 * area) break;
    layer = layer.parentElement;
  }
  if (!layer || layer === document.body) return {layer: false, inside: false, text: ''};
  const text = (layer.innerText || '').replace(/\\s+/g, ' ').trim().slice(0, 120);
  return {layer: true, inside: !!picked && layer.contains(picked), text};
}
"""


def _broken(exc: Exception, locator) -> str:
    """Why the failure is the locator's (one word), or "" when it is not: a real failure stays one."""
    text = str(exc)
    if "strict mode violation" in text:
        return "strict"
    if "intercepts pointer events" in text:
        return "cover"
    try:
        count = locator.count()
    except Exception:
        return ""
    if count == 0:
        try:  # a late page: give it until its network is idle before calling the element gone
            locator.page.wait_for_load_state("networkidle", timeout=5000)
            count = locator.count()
        except Exception:
            pass
    if count == 1:
        try:  # the old element kept in the page but hidden (display: none), its part now played by another
            return "" if locator.is_visible() else "missing"
        except Exception:
            return ""
    return "missing" if count == 0 else "strict"


def _wrap_action(state: _State, cls, name: str) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def healing(self, *args, **kwargs):
        frame = None if state.busy else _script_frame(state.script)
        if frame is None:
            return original(self, *args, **kwargs)
        selector = _selector(self)
        where = dict(_where(frame), method=name)
        del frame
        if selector in state.healed:
            _tell_reuse(state, selector, where)
            return original(_rebuilt(state, self, selector), *args, **_without_position(kwargs))
        intent = _intent_for(state, where["line"], selector, self.page)
        reason = ""
        if _is_css(selector) and intent and intent.get("near"):
            now = _near_of(state.locate, self.page, selector)
            if now is not None and now != intent["near"]:
                reason = f'its element now follows "{now}", not "{intent["near"]}"'
        if not reason:
            try:
                probe = dict(kwargs)
                probe.setdefault("timeout", state.probe_ms)
                return original(self, *args, **probe)
            except _playwright_error() as exc:
                broken = _broken(exc, self)
                if not broken:
                    if "timeout" in kwargs or "Timeout" not in type(exc).__name__:
                        raise
                    return original(self, *args, **kwargs)  # one element, only slow: the script's own timeout
                reason = str(exc).strip().splitlines()[0]
                kind = "cover" if broken == "cover" else "locate"
        else:
            kind = "locate"
        return _healed_call(state, self, original, name, args, kwargs, reason, where, intent, kind)

    setattr(cls, name, healing)


def _healed_call(state, locator, original, name, args, kwargs, reason, where, intent, kind):
    state.busy = True
    try:
        try:
            new = _heal(state, locator, name, reason, where, intent, kind)
        except _Covered as covered:  # close what lies over it first; the step then heals again from a new look
            new = _heal(state, locator, name, reason, where, intent, "cover", at=covered.point)
            kind = "cover"
        page = locator.page
        built = state.locate.to_playwright(page, new)
        if kind == "cover":
            # Dismissed now, then whenever it shows again (a handler registered first would also fire
            # before this very click, and the click would then wait for a button already gone).
            built.click()
            page.add_locator_handler(built, lambda found: found.click())
            state.busy = False
            state.covers += 1
            if state.covers > MAX_COVERS:
                raise HealStopped("Something covers the page again and again, so the replay stops here.")
            # The step again, through the hook: the layer is gone, but its own locator may be broken too.
            return getattr(type(locator), name)(locator, *args, **kwargs)
        state.healed[_selector(locator)] = {"locator": new}
    finally:
        state.busy = False
    return original(built, *args, **_without_position(kwargs))


def _tell_reuse(state: _State, selector: str, where: dict) -> None:
    """A healed locator used again: outside writes it into the healed script too (never silently)."""
    answer = state.channel.ask({"type": "reused", "failing": selector, "where": where})
    if "stop" in answer:
        raise HealStopped(str(answer["stop"]))


def _rebuilt(state: _State, locator, selector: str):
    return state.locate.to_playwright(locator.page, state.healed[selector]["locator"])


def _without_position(kwargs: dict) -> dict:
    """The recorded point inside the old element means nothing on the new one: act at its centre."""
    return {k: v for k, v in kwargs.items() if k not in ("position", "source_position")}


def _wrap_assertion(state: _State, cls, name: str) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def healing(self, *args, **kwargs):
        frame = None if state.busy else _script_frame(state.script)
        if frame is None:
            return original(self, *args, **kwargs)
        from playwright._impl._sync_base import mapping

        locator = mapping.from_impl(self._impl_obj._actual_locator)
        selector = _selector(locator)
        where = dict(_where(frame), method=name)
        del frame
        if selector in state.healed:
            _tell_reuse(state, selector, where)
            return _expect(state, _rebuilt(state, locator, selector), name, args, kwargs)
        if selector.startswith("internal:text="):
            return original(self, *args, **kwargs)  # its text is the check: healing it would change the check
        try:
            probe = dict(kwargs)
            probe.setdefault("timeout", state.probe_ms)
            return original(self, *args, **probe)
        except (AssertionError, _playwright_error()) as exc:
            broken = _broken(exc, locator)
            if not broken and (_own_intent(state, where["line"]) or {}).get("by_position"):
                broken = "drifted"  # a step's identity check: another element now stands where its element stood
            if not broken or broken == "cover":
                if "timeout" in kwargs:
                    raise
                return original(self, *args, **kwargs)
            reason = str(exc).strip().splitlines()[0]
        intent = _intent_for(state, where["line"], selector, locator.page)
        state.busy = True
        try:
            try:
                new = _heal(state, locator, name, reason, where, intent, "locate")
            except _Covered as covered:
                button = state.locate.to_playwright(
                    locator.page, _heal(state, locator, name, reason, where, intent, "cover", at=covered.point)
                )
                button.click()
                locator.page.add_locator_handler(button, lambda found: found.click())
                state.busy = False
                return getattr(type(self), name)(self, *args, **kwargs)  # the check again, through the hook
            state.healed[selector] = {"locator": new}
        finally:
            state.busy = False
        return _expect(state, _rebuilt(state, locator, selector), name, args, kwargs)

    setattr(cls, name, healing)


def _expect(state: _State, locator, name: str, args, kwargs):
    from playwright.sync_api import expect

    state.busy = True
    try:
        return getattr(expect(locator), name)(*args, **kwargs)
    finally:
        state.busy = False


def install(socket_path: str, script: str, locate_path: str, probe_ms: float) -> None:
    """Wrap Playwright's locator actions and assertions for `script` (the path it runs under)."""
    from playwright.sync_api import Locator, LocatorAssertions

    spec = importlib.util.spec_from_file_location("qvl_locate", locate_path)
    locate = importlib.util.module_from_spec(spec)
    sys.modules["qvl_locate"] = locate  # its dataclasses look their module up while they are made
    spec.loader.exec_module(locate)
    state = _State(_Channel(socket_path), script, locate, probe_ms)
    for name in ACTIONS:
        if hasattr(Locator, name):
            _wrap_action(state, Locator, name)
    for name in dir(LocatorAssertions):
        if name.startswith("to_"):
            _wrap_assertion(state, LocatorAssertions, name)


def main() -> None:
    """python hook_in_sandbox.py SOCKET LOCATE_PY PROBE_MS SCRIPT [ARGS...]: run SCRIPT healed (outside a sandbox:
    tests, and `replay --heal` where the sandbox runs its init first)."""
    import runpy

    socket_path, locate_path, probe_ms, script = sys.argv[1:5]
    install(socket_path, script, locate_path, float(probe_ms))
    sys.argv = sys.argv[4:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

if __name__ == "qvl_sandbox_hook":  # run by init_in_sandbox before the script (`replay --heal`)
    with open("/sandbox/heal.json", encoding="utf-8") as _f:
        _config = json.load(_f)
    install(_config["socket"], _config["script"], _config["locate"], float(_config["probe_ms"]))
