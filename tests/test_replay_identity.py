"""A saved script acts on the item it recorded, or fails naming its step: never on another item.

The run deletes order #1002 by clicking the Delete button of its table row (tests/pages/orders.html).
Replayed later on the same table with an order added on top, the rows reordered, or another order gone,
plain `qvl-agent replay` deletes #1002 again and only #1002; with #1002 itself gone it fails naming the
step in words, and deletes nothing. With the button renamed, `--heal` heals to a locator that still
finds the row by its order number, not by its place."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.pages.helpers import ENV, browse, call, click_at, exported, measure_along
from tests.pages.server import PageServer
from tests.support.heal_oracle import DomGroundingOracle, start

pytestmark = [pytest.mark.browser]

DELETE_1002 = "#orders tbody tr:nth-of-type(2) button"  # on the table as recorded


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The server, and the script exported from a run that deleted order #1002."""
    server = PageServer().start()
    server.variant = ""
    folder = tmp_path_factory.mktemp("orders")
    url = f"{server.url}/orders.html"
    at = measure_along(url, [("measure", DELETE_1002)])
    replies = [click_at(at[DELETE_1002]), call(action="terminate", status="success")]
    result = browse(folder, url, replies, "Delete order #1002")
    assert result.returncode == 0, result.stderr
    assert server.records("orders") == [{"deleted": "1002"}]
    source = exported(folder)
    assert 'page.locator("tr").filter(has=page.get_by_text("#1002", exact=True))' in source
    assert '.get_by_role("button", name="Delete", exact=True).click()' in source
    # The end state says what the run did to it: that row is gone.
    assert 'expect(page.locator("tr").filter(has=page.get_by_text("#1002", exact=True))).to_have_count(0)' in source
    yield server, folder / "out.py"
    server.stop()


def replay(script, *args: str):
    env = dict(ENV, QVL_CONFIG_DIR=str(script.parent / "config"))
    return run_cli("replay", *args, str(script), env=env, timeout=300)


@pytest.mark.parametrize("variant", ["inserted", "reordered", "removed"])
def test_the_replay_deletes_the_recorded_order_whatever_changed_around_it(recorded, variant, tmp_path):
    server, script = recorded
    server.clear()
    server.variant = variant
    done = replay(script, "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert server.records("orders") == [{"deleted": "1002"}]


def test_with_the_recorded_order_gone_the_replay_fails_naming_the_step_and_deletes_nothing(recorded, tmp_path):
    server, script = recorded
    server.clear()
    server.variant = "gone"
    done = replay(script, "--step-timeout", "3", "-o", str(tmp_path / "out"))
    assert done.returncode == 1
    assert server.records("orders") == []
    said = done.stdout + done.stderr
    assert 'Replay failed at step 1 (click the "Delete" button in the item that says "#1002", line ' in said
    assert "Timeout 3000ms exceeded" in said
    assert "Call log:" in said and "waiting for locator" in said  # Playwright's own account of what it looked for
    kept = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "failure.log" in kept and "failure-1.png" in kept  # the run folder keeps the whole story
    assert "#1002" in (tmp_path / "out" / "failure.log").read_text()


def test_a_renamed_button_heals_to_a_locator_that_still_finds_the_row_by_its_text(recorded, tmp_path):
    server, script = recorded
    server.variant = "renamed"
    oracle = DomGroundingOracle(f"{server.url}/orders.html", {'in the item that says "#1002"': DELETE_1002})
    engine, httpd = start(oracle)
    try:
        server.clear()
        healed = replay(
            script, "--heal", "--engine", engine, "--trace-dir", str(tmp_path / "heals"),
            "--step-timeout", "3", "-o", str(tmp_path / "out"),  # a broken step is probed 3 s, not 5
        )  # fmt: skip
    finally:
        httpd.shutdown()
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert server.records("orders") == [{"deleted": "1002"}]
    new = (
        'page.locator("tr").filter(has=page.get_by_text("#1002", exact=True))'
        '.get_by_role("button", name="Remove", exact=True).click()'
    )
    healed_script = script.with_name("out.healed.py")
    try:
        assert new in healed_script.read_text()
        assert "nth-of-type" not in healed_script.read_text()
    finally:
        healed_script.unlink()
