"""A page's dialog in words: the dialog prompt's values and the one line the person and the trace read."""

from __future__ import annotations

import json

from qvl_agent import actions as A


def json_text(text: str) -> str:
    """A page's text for the prompt: in double quotes, escaped as JSON, so it cannot pass for our words."""
    return json.dumps(text, ensure_ascii=False)


def dialog_fields(seen: dict, during: str) -> dict:
    """The dialog prompt's values: the page's words quoted as JSON, so they cannot pass for ours."""
    return {
        "kind": seen["type"],
        "message": json_text(seen["message"]),
        "default": f" (its default text: {json_text(seen['default'])})" if seen["default"] else "",
        "during": f"while {during} was running" if during else "while no action of yours was running",
    }


def dialog_line(record: dict) -> str:
    """`confirm "Delete?": accepted` for a recorded dialog and its answer; safe to print."""
    how = "accepted" if record.get("accept") else "dismissed"
    if record.get("accept") and "text" in record:
        how += f" with {record['text']!r}"
    return A.printable(f"{record['type']} dialog {json_text(record['message'])}: {how}")
