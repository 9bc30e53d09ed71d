"""Element resolution: which element a pointer action hit, and the most robust locator for it.

For a point in CSS pixels, `locate(page, x, y)` finds the element under it (`document.elementFromPoint`),
walks up to its interactive ancestor (`closest(button, a[href], input, ...)`; a label stands for the
control it labels) and tries locators in order of robustness: role + accessible name, label,
placeholder, test id, text, then a CSS path. A candidate is kept only when it matches exactly one element
in the page and that element is the target. When none qualifies (a canvas, an element in an iframe) the
locator is the point itself, the last resort; so is a click on a canvas or on the bare page.

Locators are plain dicts so that they go into the trace as JSON and `export` can compile them into code:

    {"kind": "role", "role": "button", "name": "Sign in"}     page.get_by_role("button", name=..., exact=True)
    {"kind": "label", "text": "Username"}                      page.get_by_label("Username", exact=True)
    {"kind": "placeholder", "text": "Full name"}               page.get_by_placeholder(..., exact=True)
    {"kind": "testid", "value": "help-toggle"}                 page.get_by_test_id("help-toggle")
    {"kind": "text", "text": "Next"}                           page.get_by_text("Next", exact=True)
    {"kind": "css", "selector": "body > div:nth-of-type(2)"}   page.locator(...)
    {"kind": "within", "item": "tr", "has_text": "#1002",      page.locator("tr").filter(has=page.get_by_text(
     "inner": {"kind": "role", "role": "button", ...}}            "#1002", exact=True)).get_by_role("button", ...)
    {"kind": "item", "item": "tr", "has_text": "#1002"}       the row itself (an end-state check: it is gone)
    {"kind": "point", "x": 640, "y": 400}                      page.mouse at the CSS pixel

An element inside a repeated structure (a table row, a list item, a card: an ancestor with siblings of
the same tag and classes) whose own name is not unique is found through the item that holds it, by a
text of that item no other item has, the way Playwright's codegen does: "the Delete button of the row
that says #1002" stays that row's button when rows are added, removed or reordered around it. A CSS path
(positional) is the last resort, when nothing on the page identifies the element. `chain(locator)` is the
one definition of which Playwright calls build each kind; the executor, the exporter and the healer all
build their locators from it.

Each resolved element also carries `near`, the nearest text before it in reading order (its caption when it
has no name): exported scripts keep it in each step's intent, and `--heal` checks a CSS-path locator's
element against it, so a field that swapped places with another is noticed instead of filled wrongly.

For the exporter it also records what an element's locator alone does not say: its state
(`element_state`: value, every selected option, checked, editable, whether the page listens to key events
on it, which needs `KEY_LISTENERS_JS` installed before the page's scripts) and where inside it a pointer
action hit (`point_on`).

The page object is Playwright's sync `Page`; this module does not import Playwright itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

INTERACTIVE = "button,a[href],input,select,textarea,[role],label,summary,[contenteditable]"
MAX_TEXT = 80  # longer texts make brittle locators
# A click on a canvas means a spot on it, one on the bare page means nothing in particular, and one on
# an (i)frame lands on a document this resolver does not enter: replaying the element would click its
# centre, so these stay points.
POINT_ONLY = ("canvas", "html", "body", "iframe", "frame", "embed", "object")

# Returns the target element (or null) for a point: the interactive ancestor of what is under it, and a
# label replaced by its control so that clicking "Remember me" resolves to the checkbox.
_TARGET_JS = """
([x, y, sel]) => {
  let el = document.elementFromPoint(x, y);
  if (!el) return null;
  let t = el.closest(sel) || el;
  if (t.tagName === 'LABEL' && t.control) t = t.control;
  return t;
}
"""
TARGET_JS = _TARGET_JS  # the same choice for a person's pointer (`act.recorder`), made inside the page

# The nearest text before an element in reading order, outside it: what a person reads as its caption when
# it has no name of its own ("Quantity" before a bare field, "Beta" before a row's star).
NEAR_JS = """(t) => {
  const walker = document.createTreeWalker(document.body || document.documentElement, NodeFilter.SHOW_TEXT);
  walker.currentNode = t;
  for (let n = walker.previousNode(); n; n = walker.previousNode()) {
    const s = (n.data || '').replace(/\\s+/g, ' ').trim();
    if (s && !t.contains(n) && !(n.parentElement && n.parentElement.closest('script,style,template'))) {
      return s.slice(0, 60);
    }
  }
  return '';
}"""

# Facts about an element that the candidate locators are built from, plus a unique CSS path.
_INFO_JS = (
    """
(t) => {
  const norm = s => (s || '').replace(/\\s+/g, ' ').trim();
  // An id that switches between letters and digits this often ("fc89yzs", "r-3Xk9") was generated when the
  // page loaded and will differ on the replay (Playwright's own selector generator skips the same ones).
  const generated = (id) => {
    let last = '', changes = 0;
    for (const c of id) {
      if (c === '-' || c === '_') continue;
      const kind = c >= 'a' && c <= 'z' ? 'lower' : c >= 'A' && c <= 'Z' ? 'upper'
        : c >= '0' && c <= '9' ? 'digit' : 'other';
      if (!(kind === 'lower' && last === 'upper') && last && last !== kind) changes++;
      last = kind;
    }
    return changes >= id.length / 4;
  };
  const stableId = (el) => el.id && /^[A-Za-z][\\w-]*$/.test(el.id) && !generated(el.id)
    && document.querySelectorAll('#' + el.id).length === 1;
  const cssPath = (el) => {
    if (stableId(el)) return '#' + el.id;
    const parts = [];
    while (el && el.nodeType === 1 && el !== document.documentElement) {
      if (stableId(el)) {
        parts.unshift('#' + el.id); break;
      }
      let part = el.tagName.toLowerCase();
      const parent = el.parentElement;
      if (parent) {
        const same = Array.from(parent.children).filter(c => c.tagName === el.tagName);
        if (same.length > 1) part += ':nth-of-type(' + (same.indexOf(el) + 1) + ')';
      }
      parts.unshift(part);
      el = parent;
    }
    return parts.join(' > ');
  };
  // The repeated items around the target (nearest first: a row, a list item, a card) that a text of their
  // own tells apart from their siblings: the texts, in reading order, that no sibling item holds whole.
  const textOf = (n) => norm(n.textContent);
  const relPath = (from, el) => {
    const parts = [];
    for (; el && el !== from; el = el.parentElement) {
      let part = el.tagName.toLowerCase();
      const same = Array.from(el.parentElement.children).filter(c => c.tagName === el.tagName);
      if (same.length > 1) part += ':nth-of-type(' + (same.indexOf(el) + 1) + ')';
      parts.unshift(part);
    }
    return parts.join(' > ');
  };
  const items = [];
  for (let a = t.parentElement; a && a.parentElement && a !== document.body; a = a.parentElement) {
    const classes = Array.from(a.classList).filter(c => /^[A-Za-z_][\\w-]*$/.test(c) && !generated(c));
    const same = Array.from(a.parentElement.children)
      .filter(c => c.tagName === a.tagName && classes.every(k => c.classList.contains(k)));
    if (same.length < 2) continue;
    const holds = (item, s) => Array.from(item.querySelectorAll('*')).some(m => textOf(m) === s);
    const texts = [];
    for (const n of a.querySelectorAll('*')) {
      if (n === t || t.contains(n) || n.contains(t) || n.closest('script,style,template')) continue;
      const s = textOf(n);
      if (s && s.length <= 60 && !texts.includes(s) && !same.some(o => o !== a && holds(o, s))) texts.push(s);
      if (texts.length === 3) break;
    }
    if (!texts.length) continue;
    const own = a.tagName.toLowerCase() + classes.map(c => '.' + c).join('');
    items.push({selectors: [own, cssPath(a.parentElement) + ' > ' + own], texts, path: relPath(a, t)});
    break;
  }
  const labels = t.labels ? Array.from(t.labels).map(l => norm(l.innerText)).filter(Boolean) : [];
  const near = ("""
    + NEAR_JS
    + """)(t);
  const r = t.getBoundingClientRect();
  return {
    tag: t.tagName.toLowerCase(),
    type: (t.getAttribute('type') || '').toLowerCase(),
    role: t.getAttribute('role') || '',
    label: norm(t.getAttribute('aria-label')) || labels[0] || '',
    placeholder: norm(t.getAttribute('placeholder')),
    testid: t.getAttribute('data-testid') || '',
    text: norm(t.innerText || t.textContent),
    css: cssPath(t),
    items,
    near,
    box: [r.x, r.y, r.width, r.height],
  };
}
"""
)

# Counts the key listeners a page adds (installed before the page's own scripts), so that the recorder can
# tell a field whose key events matter (`keys` in its state) from one where only the final value does.
KEY_LISTENERS_JS = """(() => {
  const add = EventTarget.prototype.addEventListener;
  EventTarget.prototype.addEventListener = function (type, ...rest) {
    if (type === 'keydown' || type === 'keyup' || type === 'keypress') {
      try { this.__qvlKeyListeners = (this.__qvlKeyListeners || 0) + 1; } catch (e) {}
    }
    return add.call(this, type, ...rest);
  };
})();"""

# State of a form element: what `export` turns into fill / check / select_option and final assertions.
# `keys`: the page listens to key events on the element or on its way up to the window (so typing must
# stay key presses); `editable`: a contenteditable element (its value is its text, not a form value).
STATE_JS = """
(t) => {
  if (!t || !t.isConnected) return null;
  const s = {tag: t.tagName.toLowerCase(), type: (t.getAttribute('type') || '').toLowerCase()};
  if (t.tagName === 'SELECT') {
    s.value = t.value;
    s.label = t.selectedIndex >= 0 ? t.options[t.selectedIndex].label : '';
    if (t.multiple) {
      s.multiple = true;
      s.values = Array.from(t.selectedOptions).map(o => o.value);
      s.labels = Array.from(t.selectedOptions).map(o => o.label);
    }
  } else if (t.tagName === 'INPUT' && (s.type === 'checkbox' || s.type === 'radio')) {
    s.checked = t.checked;
  } else if (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA') {
    s.value = t.value;
  } else if (t.isContentEditable) {
    s.value = t.innerText;
    s.editable = true;
  }
  const listens = n => n && (n.__qvlKeyListeners || n.onkeydown || n.onkeyup || n.onkeypress);
  for (let n = t; n; n = n.parentNode) if (listens(n)) { s.keys = true; break; }
  if (listens(window)) s.keys = true;
  return s;
}
"""

# Where a pointer action hit its element: the offset from the element's padding box (what Playwright's
# `position=` means) and whether the element's centre, where a locator alone would act, hits another target.
POINT_JS = """
(t, [x, y, sel]) => {
  const r = t.getBoundingClientRect(), cs = getComputedStyle(t);
  const round = v => Math.round(v * 10) / 10;
  const offset = [round(x - r.left - parseFloat(cs.borderLeftWidth)),
                  round(y - r.top - parseFloat(cs.borderTopWidth))];
  const hit = (px, py) => {
    const el = document.elementFromPoint(px, py);
    const target = el && (el.closest(sel) || el);
    return target && target.tagName === 'LABEL' && target.control ? target.control : target;
  };
  return {offset, centre_hits_other: hit(r.left + r.width / 2, r.top + r.height / 2) !== hit(x, y)};
}
"""

_SNAPSHOT_HEAD = re.compile(r'^- (?P<role>[a-z]+)(?: "(?P<name>(?:[^"\\]|\\.)*)")?')


@dataclass(frozen=True)
class Located:
    """The locator for the element at a point, and what was found there."""

    locator: dict
    element: dict = field(default_factory=dict)  # tag, type, css, box of the target; empty for a point
    handle: object | None = field(default=None, repr=False, compare=False)  # Playwright ElementHandle


def _role_and_name(page, css: str) -> tuple[str, str]:
    """The role and accessible name Playwright itself computes, from the element's ARIA snapshot."""
    try:
        snapshot = page.locator(css).first.aria_snapshot(timeout=2000)
    except Exception:  # an element hidden from the accessibility tree has no snapshot
        return "", ""
    m = _SNAPSHOT_HEAD.match(snapshot.strip().splitlines()[0] if snapshot.strip() else "")
    if not m:
        return "", ""
    name = m.group("name") or ""
    try:
        name = json.loads(f'"{name}"')
    except json.JSONDecodeError:
        pass
    return m.group("role"), name


Call = tuple[str, tuple, dict]  # (method, positional arguments, keywords)


def chain(locator: dict) -> list[Call]:
    """The Playwright calls that build a locator dict's Locator, in order, starting from the page. A keyword
    whose value is a list is itself such a chain from the page (`filter(has=...)`). ValueError for a point
    or an unknown kind."""
    kind = locator.get("kind")
    if kind == "role":
        return [("get_by_role", (locator["role"],), {"name": locator["name"], "exact": True})]
    if kind in ("label", "placeholder", "text"):
        return [(f"get_by_{kind}", (locator["text"],), {"exact": True})]
    if kind == "testid":
        return [("get_by_test_id", (locator["value"],), {})]
    if kind == "css":
        return [("locator", (locator["selector"],), {})]
    if kind == "item":  # the repeated item itself: its end-state check ("the row is gone")
        has = [("get_by_text", (locator["has_text"],), {"exact": True})]
        return [("locator", (locator["item"],), {}), ("filter", (), {"has": has})]
    if kind == "within":
        inner = locator["inner"]
        if inner.get("kind") in ("within", "item"):
            raise ValueError("An item inside an item is not a locator this resolver makes.")
        return chain(item_of(locator)) + chain(inner)
    raise ValueError(f"A {kind} locator has no Playwright Locator.")


def item_of(locator: dict) -> dict:
    """The item a `within` locator finds its element in, as a locator of its own."""
    return {"kind": "item", "item": locator["item"], "has_text": locator["has_text"]}


def to_playwright(page, locator: dict):
    """The Playwright Locator for a locator dict (not for a point)."""

    def build(calls: list[Call]):
        found = page
        for method, args, keywords in calls:
            keywords = {k: build(v) if isinstance(v, list) else v for k, v in keywords.items()}
            found = getattr(found, method)(*args, **keywords)
        return found

    return build(chain(locator))


def is_unique(page, locator: dict, handle=None) -> bool:
    """Whether the locator matches exactly one element (and, given a handle, that it is that element)."""
    try:
        loc = to_playwright(page, locator)
        if loc.count() != 1:
            return False
        return handle is None or bool(loc.evaluate("(el, t) => el === t", handle))
    except Exception:  # a selector the page cannot evaluate is simply not a candidate
        return False


def candidates(page, info: dict) -> list[dict]:
    """Locators for the element described by `info`, most robust first (not yet checked)."""
    found: list[dict] = []
    role, name = _role_and_name(page, info["css"])
    if role and name and role not in ("generic", "paragraph", "text"):
        found.append({"kind": "role", "role": role, "name": name})
    if info["label"]:
        found.append({"kind": "label", "text": info["label"]})
    if info["placeholder"]:
        found.append({"kind": "placeholder", "text": info["placeholder"]})
    if info["testid"]:
        found.append({"kind": "testid", "value": info["testid"]})
    if info["text"] and len(info["text"]) <= MAX_TEXT and info["tag"] not in ("input", "select", "textarea"):
        found.append({"kind": "text", "text": info["text"]})
    own = [c for c in found if c["kind"] in ("role", "text", "label", "placeholder")]
    for item in info.get("items") or []:  # the same names inside the item that holds the element
        inner = [*own, {"kind": "css", "selector": item["path"]}] if item["path"] else own
        for selector in item["selectors"]:
            for text in item["texts"]:
                found += [{"kind": "within", "item": selector, "has_text": text, "inner": i} for i in inner]
    found.append({"kind": "css", "selector": info["css"]})
    return found


def resolve_handle(page, handle) -> Located | None:
    """The most robust unique locator for an element handle, or None when the handle is not an element."""
    info = handle.evaluate(_INFO_JS)
    for locator in candidates(page, info):
        if is_unique(page, locator, handle):
            element = {k: info[k] for k in ("tag", "type", "role", "css", "near", "box")}
            if info["text"] and len(info["text"]) <= MAX_TEXT and info["tag"] not in ("input", "select", "textarea"):
                element["text"] = info["text"]  # what the element reads, for an intent without a name
            return Located(locator, element, handle)
    return None


def locate(page, x: float, y: float) -> Located:
    """The locator for whatever a click at CSS pixel (x, y) of the viewport would hit."""
    point = {"kind": "point", "x": round(x), "y": round(y)}
    handle = page.evaluate_handle(_TARGET_JS, [x, y, INTERACTIVE])
    element = handle.as_element()
    if element is None:
        return Located(point)
    tag = element.evaluate("(el) => el.tagName.toLowerCase()")
    if tag in POINT_ONLY:
        return Located(point, {"tag": tag}, element)
    return resolve_handle(page, element) or Located(point, {}, element)


def focused(page) -> Located | None:
    """The locator for the element that has keyboard focus, or None when focus is on the page itself."""
    handle = page.evaluate_handle(
        "() => { const a = document.activeElement;"
        " return a && a !== document.body && a !== document.documentElement ? a : null; }"
    )
    element = handle.as_element()
    if element is None:
        return None
    return resolve_handle(page, element)


def point_on(handle, x: float, y: float) -> dict:
    """For a pointer action at CSS pixel (x, y) on the element `handle`: {"offset": [dx, dy] from its
    padding box, "centre_hits_other": whether a click at its centre would hit another target}."""
    try:
        return handle.evaluate(POINT_JS, [x, y, INTERACTIVE])
    except Exception:  # the element left the page
        return {}


def element_state(handle) -> dict | None:
    """Value / checked / selected option of a form element (None once it left the page)."""
    if handle is None:
        return None
    try:
        return handle.evaluate(STATE_JS)
    except Exception:  # the element's page navigated away or closed
        return None
