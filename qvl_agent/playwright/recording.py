"""What a person does in a page, as the page reports it to `act.recorder` (standard library only).

`capture_script(nonce)` is the script the recorder installs in every frame before the page's own: it
listens in the capture phase, for trusted events only, and reports each through the binding `BINDING`
(signed with the recording's key, `signing`): `pointerdown` (the target `locate` would choose for that point,
its state, the page's text), `beforeinput` (the first of a run of typing into one element, with its state
before it), `keydown` (named keys and chords; inside a text field only Enter, Tab and Escape) and the
`change` of a `<select>` (its state before and after). The element itself stays in the page, in a table
the recorder reads by id: a report carries no description of it that the page could forge. A `click` that
comes while its `pointerdown` is still being recorded is held back and dispatched again once it is, or
at the person's next press or key, whichever comes first, so their actions always happen in their order.

`check_payload(payload, nonce)` is the one place a report becomes data: the signature, the kind, and every
field's type and size are checked, unknown fields dropped; anything else is None. `Reports` takes each
document's reports once and in order.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from qvl_agent.playwright.locate import INTERACTIVE, STATE_JS, TARGET_JS
from qvl_agent.playwright.signing import SIGN_JS, opened

BINDING = "__qvlRecord"
MAX_TEXT = 200_000  # the page text kept for "what appeared after the last click"
HOLD_CLICK_MS = 3000  # the longest a click waits for its step to be resolved

# {sign}, {key}, {tag}, {binding}, {target}, {state}, {interactive} are filled in by `capture_script`.
CAPTURE_JS = """((key, tag, binding, sel) => {
  const mark = '__qvlRecording_' + tag;
  if (window[mark]) return;
  Object.defineProperty(window, mark, {value: true});
  %(sign)s
  const TARGET = %(target)s;
  const STATE = %(state)s;
  const targets = new Map();
  let next = 0;
  const keep = (el) => {
    next += 1;
    targets.set(next, el);
    if (targets.size > 500) targets.delete(targets.keys().next().value);
    return next;
  };
  Object.defineProperty(window, '__qvlTarget_' + tag, {value: (id) => targets.get(id) || null});
  let call = window[binding];
  let seq = 0;
  const doc = quote(random());
  const send = (payload) => {
    if (typeof call !== 'function') call = window[binding];
    if (typeof call !== 'function') return Promise.resolve();
    // The page sees what is sent (the binding runs in its world, through its JSON): a signed string that
    // names its document and its place in it, so that what the page sends itself or again is dropped.
    seq += 1;
    const text = encode({...payload, seq, doc, url: '' + location.href});
    try { return Promise.resolve(call(mac(text) + text)).catch(() => {}); } catch (e) { return Promise.resolve(); }
  };
  const state = (el) => { try { return STATE(el); } catch (e) { return null; } };
  const deep = (e) => (e.composedPath && e.composedPath()[0]) || e.target;
  const element = (n) => n && n.nodeType === 1 ? n : null;
  const TEXT_TYPES = new Set(['', 'text', 'email', 'password', 'search', 'tel', 'url', 'number', 'date', 'time',
                              'datetime-local', 'month', 'week']);
  const isField = (t) => !!t && ((t.tagName === 'INPUT' && TEXT_TYPES.has((t.getAttribute('type') || '').toLowerCase()))
                                 || t.tagName === 'TEXTAREA' || t.isContentEditable);
  const NAMED = new Set(['Enter', 'Tab', 'Escape', 'ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'PageUp',
                         'PageDown', 'Home', 'End', 'Delete', 'Backspace', ' ', 'F1', 'F2', 'F3', 'F4', 'F5', 'F6',
                         'F7', 'F8', 'F9', 'F10', 'F11', 'F12']);
  const keyName = (e) => {
    const modifier = ['Control', 'Shift', 'Alt', 'Meta', 'AltGraph', 'CapsLock', 'Dead', 'Unidentified'];
    if (modifier.includes(e.key)) return null;
    const mods = (e.ctrlKey ? 'Control+' : '') + (e.altKey ? 'Alt+' : '') + (e.metaKey ? 'Meta+' : '');
    const key = e.key === ' ' ? 'Space' : e.key;
    if (mods) return mods + (e.shiftKey ? 'Shift+' : '') + (key.length === 1 ? key.toLowerCase() : key);
    if (!NAMED.has(e.key)) return null;
    return (e.shiftKey ? 'Shift+' : '') + key;
  };
  // In a field the value records the editing: only keys that leave it or act on the page are steps.
  const FIELD_KEYS = new Set(['Enter', 'Tab', 'Shift+Tab', 'Escape']);
  const EDIT_CHORD = /^(Control|Meta)\\+[acvxyz]$/;
  let typing = null, waiting = null, pressed = null, release = null;
  // The field being typed into as it is now, as the typing ends: the page may navigate before the
  // recorder could read it (Enter that submits, a click on the submit button).
  const leave = () => { const t = typing; typing = null; return t && t.isConnected ? state(t) : null; };
  const selects = new WeakMap();

  // A held click happens at the latest when the person presses or types again: a click let go after
  // their next press would move the focus away from where they now type (a label focuses its box).
  const happen = () => { if (release) release(); };

  addEventListener('pointerdown', (e) => {
    if (!e.isTrusted) return;
    happen();
    const typed = leave();
    let t = null;
    try { t = TARGET([e.clientX, e.clientY, sel]); } catch (err) { t = null; }
    t = element(t) || element(deep(e));
    if (!t) return;
    pressed = t;
    if (t.tagName === 'SELECT') selects.set(t, state(t));
    let text = '';
    try { text = document.body ? document.body.innerText.slice(0, %(max_text)d) : ''; } catch (err) {}
    const sent = send({kind: 'pointer', id: keep(t), button: e.button, count: e.detail, x: e.clientX,
                       y: e.clientY, state: state(t), text, typed});
    const held = Promise.race([sent, new Promise((r) => setTimeout(r, %(hold_ms)d))]);
    waiting = held;
    held.then(() => { if (waiting === held) waiting = null; });
  }, true);

  // A click whose step is not resolved yet waits for it, then happens as it would have.
  addEventListener('click', (e) => {
    if (!e.isTrusted || !waiting) return;
    const held = waiting, t = e.target;
    waiting = null;
    e.preventDefault();
    e.stopImmediatePropagation();
    const init = {bubbles: true, cancelable: true, composed: true, view: window, detail: e.detail,
                  screenX: e.screenX, screenY: e.screenY, clientX: e.clientX, clientY: e.clientY,
                  ctrlKey: e.ctrlKey, shiftKey: e.shiftKey, altKey: e.altKey, metaKey: e.metaKey,
                  button: e.button, buttons: e.buttons};
    const fire = () => {
      if (release !== fire) return;  // it happened already
      release = null;
      if (t.isConnected) t.dispatchEvent(new MouseEvent('click', init));
    };
    happen();  // an older held click first, in the person's order
    release = fire;
    held.then(fire);
  }, true);

  addEventListener('beforeinput', (e) => {
    if (!e.isTrusted) return;
    const t = element(deep(e));
    if (!t || t === typing) return;
    // Enter in a one-line field asks for a line break it never gets: the key is the step, not typing.
    if (t.tagName === 'INPUT' && (e.inputType === 'insertLineBreak' || e.inputType === 'insertParagraph')) return;
    const typed = leave();
    typing = t;
    send({kind: 'typing', id: keep(t), state: state(t), typed, own: t === pressed});
  }, true);

  addEventListener('keydown', (e) => {
    if (!e.isTrusted) return;
    happen();
    if (e.isComposing) return;
    const name = keyName(e);
    if (!name) return;
    let t = element(deep(e));
    if (t === document.body || t === document.documentElement) t = null;
    if (isField(t) && !FIELD_KEYS.has(name) && (!/^(Control|Alt|Meta)\\+/.test(name) || EDIT_CHORD.test(name))) return;
    const own = !!t && t === typing;  // a key ending the typing in its own field (Enter that submits it)
    const typed = leave();
    send({kind: 'key', keys: name, id: t ? keep(t) : 0, state: t ? state(t) : null, typed, own});
  }, true);

  // The listener above is the recorder's, not the page's: the fields' `keys` state must not count it.
  if (typeof window.__qvlKeyListeners === 'number') window.__qvlKeyListeners -= 1;

  addEventListener('focusin', (e) => {
    const t = element(deep(e));
    if (t && t.tagName === 'SELECT') selects.set(t, state(t));
  }, true);

  addEventListener('change', (e) => {
    if (!e.isTrusted) return;
    const t = element(deep(e));
    if (!t || t.tagName !== 'SELECT') return;
    const now = state(t), before = selects.has(t) ? selects.get(t) : null;
    selects.set(t, now);
    send({kind: 'select', id: keep(t), before, state: now, typed: leave()});
  }, true);
})(%(key)s, %(tag)s, %(binding)s, %(interactive)s);"""


def target_tag(nonce: str) -> str:
    """The suffix of the capture script's names in the page (`__qvlTarget_<tag>`): derived from the nonce
    but not revealing it, since a page can list its window's property names."""
    return hashlib.sha256(f"qvl-recording:{nonce}".encode()).hexdigest()[:24]


def capture_script(nonce: str) -> str:
    """The capture script for one recording (the nonce is the key that signs its reports)."""
    return CAPTURE_JS % {
        "target": TARGET_JS.strip(),
        "state": STATE_JS.strip(),
        "max_text": MAX_TEXT,
        "hold_ms": HOLD_CLICK_MS,
        "sign": SIGN_JS.strip(),
        "key": json.dumps(list(bytes.fromhex(nonce))),
        "tag": json.dumps(target_tag(nonce)),
        "binding": json.dumps(BINDING),
        "interactive": json.dumps(INTERACTIVE),
    }


# --- what the page may hand over -----------------------------------------------------------------------

_STATE_TEXT = ("tag", "type", "value", "label")
_STATE_FLAGS = ("multiple", "checked", "editable", "keys")
_KEY = re.compile(r"((Control|Alt|Meta|Shift)\+){0,4}(\S|[A-Z][A-Za-z0-9]{1,15})")
_LIMIT = 100_000


def _text(value, limit: int = _LIMIT) -> str | None:
    return value if isinstance(value, str) and len(value) <= limit else None


def _number(value) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok and abs(value) < 1e6 else None


def _state(value) -> dict | None:
    """An element state (`locate.STATE_JS`) as the page reported it, or None when it is not one."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return None
    out: dict = {}
    for key in _STATE_TEXT:
        if key in value:
            if _text(value[key]) is None:
                return None
            out[key] = value[key]
    for key in _STATE_FLAGS:
        if key in value:
            if not isinstance(value[key], bool):
                return None
            out[key] = value[key]
    for key in ("values", "labels"):
        if key in value:
            items = value[key]
            if not isinstance(items, list) or len(items) > 1000 or any(_text(i) is None for i in items):
                return None
            out[key] = list(items)
    return out if "tag" in out else None


def check_payload(payload, nonce: str) -> dict | None:
    """The event a capture script reported, with only fields of the expected types, or None: a report not
    signed with the recording's key (`signing`: a page calling the binding itself) and a malformed one are
    dropped whole."""
    text = opened(payload, bytes.fromhex(nonce))
    try:
        payload = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    seq, doc = payload.get("seq"), _text(payload.get("doc"), 40)
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq < 2**53 or doc is None:
        return None
    kind = payload.get("kind")
    if kind not in ("pointer", "typing", "key", "select"):
        return None
    target = payload.get("id")
    url = _text(payload.get("url"))
    if not isinstance(target, int) or isinstance(target, bool) or not 0 <= target < 2**31 or url is None:
        return None
    state = _state(payload.get("state")) if payload.get("state") is not None else None
    if payload.get("state") is not None and state is None:
        return None
    typed = _state(payload.get("typed")) if payload.get("typed") is not None else None
    event: dict = {"kind": kind, "id": target, "url": url, "state": state, "typed": typed, "seq": seq, "doc": doc}
    if kind == "pointer":
        x, y = _number(payload.get("x")), _number(payload.get("y"))
        button, count = payload.get("button"), payload.get("count")
        if x is None or y is None or button not in (0, 1, 2) or not isinstance(count, int) or not 0 <= count <= 10:
            return None
        event.update(x=x, y=y, button=button, count=count, text=_text(payload.get("text"), MAX_TEXT) or "")
    elif kind == "key":
        keys = payload.get("keys")
        if not isinstance(keys, str) or len(keys) > 64 or not _KEY.fullmatch(keys):
            return None
        event["keys"] = keys
    if kind in ("key", "typing"):
        event["own"] = payload.get("own") is True  # the element of the step before (see `act.recorder`)
    elif kind == "select":
        event["before"] = _state(payload.get("before")) if payload.get("before") is not None else None
    return event


class Reports:
    """The reports of one recording (`check_payload`), each document's taken once and in order: a signed
    report the page saw and sends again, or holds back and sends late, is dropped."""

    KEEP = 1000  # documents remembered (the oldest forgotten first)

    def __init__(self, nonce: str):
        self.nonce = nonce
        self._last: dict[str, int] = {}

    def open(self, payload) -> dict | None:
        event = check_payload(payload, self.nonce)
        if event is None:
            return None
        doc, seq = event.pop("doc"), event.pop("seq")
        if seq <= self._last.get(doc, 0):
            return None
        if doc not in self._last and len(self._last) >= self.KEEP:
            del self._last[next(iter(self._last))]
        self._last[doc] = seq
        return event
