"""`qvl-agent playwright`: model-written scripts are checked by the policy, run only with --verify (in a
fresh headless browser), and failures go back to the model. The model is a replay of recorded replies."""

from __future__ import annotations

import pytest

from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.image import Screenshot
from qvl_agent.scripts.header import with_header
from qvl_agent.scripts.write.writer import extract_script, write_script
from tests.conftest import run_cli
from tests.pages.helpers import CHROMIUM, write_replay
from tests.pages.server import PageServer
from tests.support.paths import path_without

pytestmark = [
    pytest.mark.browser,
]

SCRIPT = """```python
import os
from playwright.sync_api import sync_playwright, expect

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("QVL_BROWSER") or None)
    page = browser.new_page()
    page.set_default_timeout(3000)
    page.goto("{url}/login.html")
    page.get_by_role("textbox", name="Username", exact=True).fill("grace")
    page.get_by_role("textbox", name="Password", exact=True).fill("hopper")
    page.get_by_role("button", name="{button}", exact=True).click(timeout=2000)
    expect(page.get_by_role("heading", name="Welcome, grace")).to_be_visible()
    browser.close()
```"""

EVIL = """```python
import os
from playwright.sync_api import sync_playwright
os.system("touch {marker}")
```"""


@pytest.fixture
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


def verify(server, replay, out, *args):
    """`playwright --verify` on the login page with the replayed replies, the script written to `out`."""
    return run_cli(
        "playwright", "--url", server.url + "/login.html", "--engine", f"replay:{replay}", "--verify",
        "-o", str(out), *args,
        env={"QVL_BROWSER": CHROMIUM, "QVL_CONFIG_DIR": str(out.parent / "config")}, timeout=240,
    )  # fmt: skip


def test_verify_feeds_a_failing_script_back_and_keeps_the_one_that_passes(tmp_path, server):
    marker = tmp_path / "evil-ran"
    replies = [
        EVIL.format(marker=marker),  # refused by the policy: never runs
        SCRIPT.format(url=server.url, button="Log in"),  # no such button: fails verification
        SCRIPT.format(url=server.url, button="Sign in"),
    ]
    replay = write_replay(tmp_path / "replies.json", replies)
    out = tmp_path / "login.py"
    result = run_cli(
        "playwright",
        "--url",
        server.url + "/login.html",
        "--engine",
        f"replay:{replay}",
        "--verify",
        "-o",
        str(out),
        "Sign in as grace with password hopper",
        env={"QVL_BROWSER": CHROMIUM, "QVL_CONFIG_DIR": str(tmp_path / "config")},
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert "attempt 1: the safety policy refused it" in result.stderr
    assert "os.system" in result.stderr
    assert "attempt 2: running it failed" in result.stderr
    assert "attempt 3: passed the policy and verification" in result.stderr
    assert out.read_text() == with_header(extract_script(replies[2]), "login.py", [server.url])
    assert out.read_text().splitlines()[1].startswith("# Run it with: qvl-agent replay login.py")
    assert not marker.exists()
    # Only the script that passed signed in, in its own browser.
    assert server.records("login") == [{"username": "grace", "password": "hopper"}]


def test_the_verification_error_goes_back_to_the_model(tmp_path, server):
    replies = [
        SCRIPT.format(url=server.url, button="Log in"),
        SCRIPT.format(url=server.url, button="Sign in"),
    ]
    engine = ReplayEngine(replies)
    shot = Screenshot(bytes(64 * 48 * 3), 64, 48, "RGB")
    outcome = write_script(
        engine,
        shot,
        url=server.url + "/login.html",
        task="Sign in",
        snapshot='- button "Sign in"',
        viewport=(1280, 800),
        attempts=2,
        verify=True,
        browser=CHROMIUM,
        timeout_s=60,
    )
    assert outcome.ok
    assert len(engine.requests) == 2
    first, second = engine.requests
    assert "Sign in" in first.text and first.image_hashes == [shot.content_hash]
    assert "did not pass" in second.text and "Log in" in second.text  # Playwright's own error message
    assert second.image_hashes == []


def test_without_verify_nothing_runs_and_a_refused_script_is_never_written(tmp_path, server):
    replay = write_replay(tmp_path / "r.json", [SCRIPT.format(url=server.url, button="Sign in")])
    env = {"QVL_BROWSER": CHROMIUM, "QVL_CONFIG_DIR": str(tmp_path / "config")}
    result = run_cli(
        "playwright", "--url", server.url + "/login.html", "--engine", f"replay:{replay}", "Sign in", env=env
    )
    assert result.returncode == 0, result.stderr
    assert 'name="Sign in"' in result.stdout
    assert "not run (use --verify)" in result.stderr
    assert server.records("login") == []

    marker = tmp_path / "evil-ran"
    replay = write_replay(tmp_path / "r2.json", [EVIL.format(marker=marker)])
    refused = run_cli(
        "playwright",
        "--url",
        server.url + "/login.html",
        "--engine",
        f"replay:{replay}",
        "--attempts",
        "1",
        "--verify",
        "-o",
        str(tmp_path / "x.py"),
        "Sign in",
        env=env,
    )
    assert refused.returncode == 1
    assert "refused" in refused.stderr and "none was written" in refused.stderr
    assert not (tmp_path / "x.py").exists() and not marker.exists()


SHOT = """```python
import os
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ["QVL_BROWSER"])
    page = browser.new_page()
    page.goto("{url}/login.html")
    page.screenshot(path="login.png")
    browser.close()
```"""


def test_a_failed_verification_shows_the_scripts_own_error_and_keeps_the_last_attempt(tmp_path, server):
    wrong = SCRIPT.format(url=server.url, button="Log in")
    replay = write_replay(tmp_path / "replies.json", [wrong, wrong])
    out = tmp_path / "login.py"
    result = verify(server, replay, out, "--attempts", "2", "--timeout", "20", "Sign in as grace")
    assert result.returncode == 1, result.stderr
    # Playwright's own message (the locator it waited for), not an empty line or a bare timeout.
    failure = result.stderr.split("attempt 1: running it failed: it exited with status 1:", 1)[1]
    assert 'name="Log in"' in failure.split("attempt 2")[0]
    assert "did not finish within" not in result.stderr
    assert not out.exists()
    assert (tmp_path / "login.rejected.py").read_text() == with_header(
        extract_script(wrong), "login.rejected.py", [server.url]
    )
    assert "login.rejected.py" in result.stderr


def test_files_the_verified_script_wrote_are_kept_in_a_new_folder_beside_it(tmp_path, server):
    (tmp_path / "login.png").write_bytes(b"the person's own photo")
    replay = write_replay(tmp_path / "replies.json", [SHOT.format(url=server.url)])
    out = tmp_path / "shot.py"
    result = verify(server, replay, out, "Take a screenshot")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "shot.verified" / "login.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "login.png").read_bytes() == b"the person's own photo"
    assert "login.png" in result.stderr


def test_verify_refuses_without_bubblewrap_unless_told_to_run_unsafely(tmp_path, server):
    replay = write_replay(tmp_path / "replies.json", [SHOT.format(url=server.url)])
    env = {
        "QVL_BROWSER": CHROMIUM,
        "QVL_CONFIG_DIR": str(tmp_path / "config"),
        "PATH": path_without("bwrap", tmp_path),
    }
    args = ["playwright", "--url", server.url + "/login.html", "--engine", f"replay:{replay}", "--verify"]
    refused = run_cli(*args, "-o", str(tmp_path / "a.py"), "Take a screenshot", env=env, timeout=240)
    assert refused.returncode == 2
    assert "install the package `bubblewrap`" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "a.py").exists() and not (tmp_path / "a.verified").exists()

    unsafe = run_cli(*args, "--unsafe-verify", "-o", str(tmp_path / "b.py"), "Take a screenshot", env=env, timeout=240)
    assert unsafe.returncode == 0, unsafe.stderr
    assert "warning" in unsafe.stderr and "all your rights, unsandboxed" in unsafe.stderr
    assert (tmp_path / "b.verified" / "login.png").exists()


HOSTILE_OUTPUT = """```python
from playwright.sync_api import sync_playwright
print("\\x1b[2J\\x1b]0;pwned\\x07\\x1b]52;c;cm0gLXJmIH4=\\x07 cleared")
raise SystemExit(3)
```"""

HOSTILE_NAME = """```python
import os
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("QVL_BROWSER") or None)
    page = browser.new_page()
    page.screenshot(path="shot\x1b[8m\x1b]52;c;cm0gLXJmIH4=\x07.png")
    browser.close()
```"""


def test_a_scripts_output_and_file_names_never_reach_the_terminal_as_control_sequences(tmp_path, server):
    replay = write_replay(tmp_path / "replies.json", [HOSTILE_OUTPUT, HOSTILE_NAME])
    out = tmp_path / "hostile.py"
    result = verify(server, replay, out, "--attempts", "2", "Do it")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert "\\x1b]0;pwned" in result.stderr and "cleared" in result.stderr  # shown, escaped
    assert "kept " in result.stderr and "shot\\x1b[8m" in result.stderr


DOWNLOADS = """```python
import os
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("QVL_BROWSER") or None)
    page = browser.new_page()
    page.set_content('<a download href="data:text/plain,import os">a</a><a download href="data:text/csv,a,b">b</a>')
    with page.expect_download() as first:
        page.get_by_text("a", exact=True).click()
    first.value.save_as("conftest.py")
    with page.expect_download() as second:
        page.get_by_text("b", exact=True).click()
    second.value.save_as("report.csv")
    browser.close()
```"""


def test_a_download_under_a_name_that_runs_by_itself_is_not_kept(tmp_path, server):
    # pytest would import conftest.py from the folder the person saved the script in.
    replay = write_replay(tmp_path / "replies.json", [DOWNLOADS])
    out = tmp_path / "get.py"
    result = verify(server, replay, out, "Download the report")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "get.verified" / "report.csv").read_text() == "a,b"
    assert not (tmp_path / "conftest.py").exists()
    assert "not kept conftest.py" in result.stderr


SCRAPER = """```python
import csv, os
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ["QVL_BROWSER"])
    page = browser.new_page()
    page.goto("{url}/login.html")
    rows = []
    for field in page.get_by_role("textbox").all():
        print("field", field.get_attribute("name"))
        rows.append([field.get_attribute("name")])
    with open("fields.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    page.pdf(path="page.pdf")
    browser.close()
```"""


def test_an_ordinary_scraper_that_prints_in_a_loop_verifies(tmp_path, server):
    replay = write_replay(tmp_path / "replies.json", [SCRAPER.format(url=server.url)])
    out = tmp_path / "scrape.py"
    result = verify(server, replay, out, "List the fields")
    assert result.returncode == 0, result.stderr
    assert "attempt 1: passed the policy and verification" in result.stderr
    assert (tmp_path / "scrape.verified" / "fields.csv").read_text().split() == ["username", "password"]
    assert (tmp_path / "scrape.verified" / "page.pdf").read_bytes().startswith(b"%PDF")


BYPASSES = """```python
import argparse, os
from playwright.sync_api import sync_playwright

def gen():
    yield 1

g = gen()
match g:
    case object(gi_frame=frame):
        imp = frame.f_builtins["__import__"]
        imp("os").system("touch {marker}")
parser = argparse.ArgumentParser("x", None, None, None, [], argparse.HelpFormatter, "-", "@")
parser.add_argument("rest", nargs="*")
try:
    print(parser.parse_args(["@{secret}"]))
except SystemExit:
    print("no such file in here")
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ["QVL_BROWSER"])
    page = browser.new_page()
    try:
        page.goto("file://{secret}")
        print(page.content())
    except Exception:
        pass
    page = browser.new_page()
    page.goto("{url}/login.html")
    for name in [".git/config", ".ssh/authorized_keys", ".config/autostart/x.desktop"]:
        os.makedirs(os.path.dirname(name), exist_ok=True)
        page.screenshot(path=name, type="png")
    for name in ["AGENTS.md", "CLAUDE.md", "requirements.txt"]:
        open(name, "w").write("evil")
    browser.close()
```"""


def test_policy_bypasses_pass_the_lint_but_have_no_effect_when_verified(tmp_path, server):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".git").mkdir()
    (home / ".git" / "config").write_text("[core]\n")
    secret = tmp_path / "id_rsa"
    secret.write_text("secret-key-material")
    marker = tmp_path / "bypass-ran"
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    replay = write_replay(tmp_path / "replies.json", [BYPASSES.format(marker=marker, secret=secret, url=server.url)])
    result = verify(server, replay, home / "evil.py", "Do it")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert "secret-key-material" not in result.stderr
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file() and p.parent == home / ".git"} == before
    assert not (home / ".ssh").exists() and not (home / ".config").exists()
    assert not any((home / name).exists() for name in ("AGENTS.md", "CLAUDE.md", "requirements.txt"))
    assert not (home / "evil.verified").exists()  # nothing it wrote was worth keeping
