"""The end-state checks of an exported script (pure: no Playwright).

From the final state the browser executor checked in the live page (`final.json`: the URL, the state of
every element the run touched that is still there and unique, text that appeared after the last click),
only checks that the exported steps produce and that Playwright can make on that element:

  - a checkbox or radio: `to_be_checked` / `not_to_be_checked`;
  - a multi-select: `to_have_values` with every selected value; a select, input or textarea: `to_have_value`;
  - a contenteditable element (no form value): `to_have_text` of its rendered text;
  - text that appeared after the last click: visible, its digits matching any digits (an order number or
    a time is made up anew on the replay);
  - nothing on an element whose step the script could not express (`lost`), and then no new-text checks
    either, since what appeared may have come from that step;
  - a value that shows a secret (masked there as `{{NAME}}`): checked against the expression the script
    filled it with (`filled`), which reads the secret where the run typed it; else not checked, and no
    text that shows one is checked either.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from qvl_agent.scripts.export.steps import python_locator, q, target_key
from qvl_agent.scripts.literals import comment_text, lit
from qvl_agent.secrets import PLACEHOLDER

FORM_TAGS = {"input", "textarea", "select"}


def _shows_secret(text) -> bool:
    return bool(PLACEHOLDER.search(str(text)))


def field_assertion(code: str, state: dict, filled: str | None = None) -> str | None:
    """The `expect` line for one element's final state, or None when there is nothing Playwright can check.
    `filled`: the expression the script filled the element with, for a value that shows a secret."""
    if "checked" in state:
        return f"expect({code}).{'to_be_checked' if state['checked'] else 'not_to_be_checked'}()"
    if state.get("multiple") and state.get("values") is not None:
        return f"expect({code}).to_have_values({lit(list(state['values']))})"
    if "value" not in state:
        return None
    if _shows_secret(state["value"]):
        if filled is None or state.get("editable") or state.get("tag") not in FORM_TAGS:
            return f"# not checked: {comment_text(code)} (its value holds a secret)"
        return f"expect({code}).to_have_value({filled})"
    if state.get("editable") or state.get("tag") not in FORM_TAGS:
        return f"expect({code}).to_have_text({q(state['value'])}, use_inner_text=True)"
    return f"expect({code}).to_have_value({q(state['value'])})"


def end_state_assertions(
    final: dict | None,
    last_url: str,
    url_expr: Callable[[str], str],
    lost: set[str] = frozenset(),
    filled: dict[str, str] | None = None,
) -> list[str]:
    """The lines checking the recorded end state (comments included for what is deliberately not checked)."""
    final = final or {}
    lines = []
    url = final.get("url") or last_url
    if url and not url.startswith(("chrome-error:", "about:")):
        lines.append(f"expect(page).to_have_url({url_expr(url)})")
    for item in final.get("fields", []):
        code = python_locator(item["locator"])
        if code is None:
            continue
        if target_key(item["locator"]) in lost:
            lines.append(f"# not checked: {comment_text(code)} (its step is not replayed)")
            continue
        line = field_assertion(code, item["state"], (filled or {}).get(target_key(item["locator"])))
        if line:
            lines.append(line)
    for item in final.get("gone", []):  # the row the run deleted (or moved away) is not there any more
        code = python_locator(item) if isinstance(item, dict) and item.get("kind") == "item" else None
        if code and not lost:
            lines.append(f"expect({code}).to_have_count(0)")
    new_text = final.get("new_text", [])
    if new_text and lost:
        lines.append("# not checked: the text that appeared at the end (it may come from a step not replayed)")
    else:
        lines.extend(text_check(text) for text in new_text if not _shows_secret(text))
    return lines


def text_check(text: str) -> str:
    """The check that `text` (a line that appeared after the last click) is on the page. Its digits may be
    an order number, a count or a time the page makes up anew on the replay: they match any digits."""
    if not re.search(r"[0-9]", text):
        return f"expect(page.get_by_text({q(text)}, exact=True)).to_be_visible()"
    # Playwright matches a pattern against the element's raw text: any white space where the line has some.
    words = (r"\s+".join(re.escape(w) for w in re.split(r"\s+", part)) for part in re.split(r"[0-9]+", text))
    pattern = r"^\s*" + r"\d+".join(words) + r"\s*$"
    return f"expect(page.get_by_text(re.compile({q(pattern)})).first).to_be_visible()"
