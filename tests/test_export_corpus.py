"""A corpus of pages where a naive export fails to replay a successful run: date and time inputs typed as
keystrokes, a multi-select picked with Ctrl, a field that clears itself on every key, a contenteditable
editor, copy and paste through the clipboard, a double click on one word, a custom dropdown beside a native
select changed by typing, a slider dragged to a point, a wizard over two pages, a survey in a tab of its own that
closes itself, and a form whose element ids and ticket number are made up anew on every load.

Each case drives `qvl-agent browse` with a replayed model whose coordinates come from the page's real
element geometry, checks what the page posted to the test server, exports the run, replays the script with
plain `python` in a fresh Chromium and checks that the page posted the same again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.pages.helpers import browse, call, click_at, exported, measure_along, replay_script
from tests.pages.server import PageServer

pytestmark = [
    pytest.mark.browser,
]


def left(selector: str, px: float) -> str:
    """JS for the CSS pixel `px` from the left edge of an element, halfway down."""
    box = f"document.querySelector({selector!r}).getBoundingClientRect()"
    return f"() => {{ const r = {box}; return [r.x + {px}, r.y + r.height / 2]; }}"


def word(selector: str, text: str) -> str:
    """JS for the centre of the word `text` inside an element's text."""
    return (
        f"() => {{ const n = document.querySelector({selector!r}).firstChild; const i = n.data.indexOf({text!r});"
        f" const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + {len(text)});"
        " const b = r.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; }"
    )


def key(*keys: str) -> str:
    return call(action="key", keys=list(keys))


def typed(text: str) -> str:
    return call(action="type", text=text)


@dataclass
class Case:
    page: str
    task: str
    plan: list[tuple]  # what to measure, walking the page as the run will (see measure_along)
    replies: object  # (points) -> model replies
    record: str
    expected: dict | None  # None: whatever the run recorded, when the page decides the exact value
    source_has: list[str] = field(default_factory=list)
    source_lacks: list[str] = field(default_factory=list)
    plausible: Callable[[dict], bool] = lambda record: True  # for a record whose exact value the page decides


DONE = call(action="terminate", status="success")

CASES = [
    Case(
        "booking.html",
        "Book a table for 3 on 15 March 2025 at 9:30",
        [
            ("point", "day", left("#day", 14)),
            ("point", "at", left("#at", 12)),
            ("measure", "#guests"),
            ("measure", "#book"),
        ],
        lambda at: [
            click_at(at["day"]),
            typed("03152025"),
            click_at(at["at"]),
            typed("0930A"),
            click_at(at["#guests"]),
            typed("3"),
            click_at(at["#book"]),
            DONE,
        ],
        "booking",
        {"day": "2025-03-15", "at": "09:30", "guests": "3"},
        ['.fill("2025-03-15")', '.fill("09:30")'],
    ),
    Case(
        "toppings.html",
        "Order a pizza with ham and onion",
        [
            (
                "point",
                "ham",
                "() => { const r = document.querySelector('option[value=ham]').getBoundingClientRect();"
                " return [r.x + r.width / 2, r.y + r.height / 2]; }",
            ),
            ("measure", "#order"),
        ],
        lambda at: [
            click_at(at["ham"]),
            key("ctrl", "down"),
            key("ctrl", "down"),
            key("ctrl", "space"),
            click_at(at["#order"]),
            DONE,
        ],
        "toppings",
        {"toppings": ["ham", "onion"]},
        ['select_option(label=["Ham", "Onion"])', 'to_have_values(["ham", "onion"])'],
    ),
    Case(
        "pin.html",
        "Unlock the safe with the code 7342",
        [("measure", "#pin"), ("measure", "#unlock")],
        lambda at: [click_at(at["#pin"]), typed("7342"), click_at(at["#unlock"]), DONE],
        "pin",
        {"code": "7342"},
        ['.press_sequentially("7342")'],
        ['.fill("")'],
    ),
    Case(
        "notes.html",
        "Write the note: Buy oat milk",
        [("measure", "#editor"), ("measure", "#save")],
        lambda at: [click_at(at["#editor"]), typed("Buy oat milk"), click_at(at["#save"]), DONE],
        "notes",
        {"text": "Buy oat milk"},
        ['to_have_text("Buy oat milk"'],
        ['to_have_value("Buy oat milk")'],
    ),
    Case(
        "clipboard.html",
        "Copy your tracking number into the look-up field and track the parcel",
        [("measure", "#given"), ("measure", "#lookup"), ("measure", "#track")],
        lambda at: [
            click_at(at["#given"]),
            key("ctrl", "a"),
            key("ctrl", "c"),
            click_at(at["#lookup"]),
            key("ctrl", "v"),
            click_at(at["#track"]),
            DONE,
        ],
        "clipboard",
        {"tracking": "TRK-5521-XK"},
        ['.press("Control+a")', '.press("Control+c")', '.press("Control+v")'],
    ),
    Case(
        "words.html",
        "Pick the fig",
        [("point", "fig", word("#words", "fig"))],
        lambda at: [call(action="double_click", coordinate=at["fig"]), DONE],
        "words",
        {"word": "fig"},
        [".dblclick(position="],
    ),
    Case(
        "shop.html",
        "Add a large green T-shirt to the cart",
        [
            ("measure", "#size"),
            ("click", "#size"),
            ("measure", "#sizes li[data-v=L]"),
            ("click", "#sizes li[data-v=L]"),
            ("measure", "#colour"),
            ("measure", "#add"),
        ],
        lambda at: [
            click_at(at["#size"]),
            click_at(at["#sizes li[data-v=L]"]),
            click_at(at["#colour"]),
            typed("Gr"),
            key("tab"),
            click_at(at["#add"]),
            DONE,
        ],
        "shop",
        {"size": "L", "colour": "g"},
        ['get_by_role("option", name="Large", exact=True).click()', 'select_option(label="Green")'],
    ),
    Case(
        "volume.html",
        "Turn the volume up to about three quarters",
        [
            ("point", "thumb", left("#volume", 7)),
            ("point", "three-quarters", left("#volume", 300)),
            ("measure", "#save"),
        ],
        lambda at: [
            call(action="left_click_drag", start_coordinate=at["thumb"], coordinate=at["three-quarters"]),
            click_at(at["#save"]),
            DONE,
        ],
        "volume",
        None,  # what the slider reads at that point: the run's own record, reproduced
        ["source_position=", "target_position="],
        plausible=lambda record: 60 <= record["volume"] <= 90,  # well off both ends, near three quarters
    ),
    Case(
        "portal.html",
        "Answer the survey as Ada, then finish",
        [
            ("measure", "#go"),
            ("goto", "survey.html"),
            ("measure", "#name"),
            ("measure", "#send"),
            ("goto", "portal.html"),
            ("measure", "#finish"),
        ],
        lambda at: [
            click_at(at["#go"]),  # opens the survey in a new tab
            click_at(at["#name"]),
            typed("Ada"),
            click_at(at["#send"]),  # the survey tab closes itself: back to the portal
            click_at(at["#finish"]),
            DONE,
        ],
        "survey",
        {"name": "Ada"},
        ["with page.expect_popup() as popup:", "page = tabs[0]"],
    ),
    Case(
        "ticket.html",
        "Open a support ticket saying the printer is broken",
        [("measure", "#start"), ("click", "#start"), ("measure", "#form input"), ("measure", "#form span")],
        lambda at: [
            click_at(at["#start"]),
            call(action="wait", time=1),  # the form comes after a moment
            click_at(at["#form input"]),
            typed("The printer is broken"),
            click_at(at["#form span"]),
            DONE,
        ],
        "ticket",
        {"text": "The printer is broken"},
        ['page.locator("#form > input").fill("The printer is broken")', r're.compile("^\\s*Ticket\\s+\\d+\\s+opened'],
    ),
    Case(
        "trip.html",
        "Book an aisle seat from Oslo to Rome",
        [
            ("measure", "#from"),
            ("measure", "#to"),
            ("measure", "button"),
            ("goto", "trip2.html?from=Oslo&to=Rome"),
            ("measure", "input[value=aisle]"),
            ("measure", "#book"),
        ],
        lambda at: [
            click_at(at["#from"]),
            typed("Oslo"),
            click_at(at["#to"]),
            typed("Rome"),
            click_at(at["button"]),
            click_at(at["input[value=aisle]"]),
            click_at(at["#book"]),
            DONE,
        ],
        "trip",
        {"from": "Oslo", "to": "Rome", "seat": "aisle"},
        ['expect(page).to_have_url(origin + "/trip2.html?from=Oslo&to=Rome")', ".check()"],
    ),
]


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.page.removesuffix(".html") for c in CASES])
def test_the_exported_script_reproduces_the_run(tmp_path, server, case):
    url = f"{server.url}/{case.page}"
    plan = [(what, f"{server.url}/{arg}" if what == "goto" else arg, *rest) for what, arg, *rest in case.plan]
    at = measure_along(url, plan)
    server.clear()
    result = browse(tmp_path, url, case.replies(at), case.task)
    assert result.returncode == 0, result.stderr
    assert server.records(case.record), "the run itself did not reach the end state"
    expected = case.expected or server.records(case.record)[-1]
    assert case.plausible(expected), expected
    assert server.records(case.record) == [expected], "the run itself did not reach the end state"

    source = exported(tmp_path)
    server.clear()
    replayed = replay_script(tmp_path / "out.py")
    assert replayed.returncode == 0, replayed.stderr + "\n" + source
    assert server.records(case.record) == [expected]
    for text in case.source_has:
        assert text in source
    for text in case.source_lacks:
        assert text not in source
