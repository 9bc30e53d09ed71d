"""A real HTTP server on 127.0.0.1 for the browser tests: serves the static pages in this folder and
records what the pages post back, so a test can check the end state a run (or a replayed script) left.

    GET  /<file>.html       the page
    GET  /site/<file>.html  the page from site-a/ or site-b/, whichever version `site` names: one URL whose
                            page changes between two visits, the way a real site changes under a saved script
    GET  /variant.js        `window.VARIANT = <variant>`: a page that builds itself from it changes between visits
    GET  /slow              answers after 0.4 s (the moving page's late content)
    POST /login             form post: recorded as "login", then 303 to /welcome?user=NAME
    GET  /welcome?user=N    "Welcome, N"
    POST /record/<name>     JSON body recorded under <name>
Paths in `die_on` stop the whole server when requested, without answering: the page dies mid-run.
"""

from __future__ import annotations

import html
import json
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

PAGES = Path(__file__).resolve().parent


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A browser that navigates away mid-response drops the connection; that is not a test failure.
        pass


class PageServer:
    def __init__(self, die_on: tuple[str, ...] = ()):
        self.die_on = set(die_on)
        self.site = "a"  # which version /site/ serves
        self.variant = ""  # what /variant.js tells a page (orders.html: how its table changed)
        self._records: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        self.httpd = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.stopped = threading.Event()

    def start(self) -> PageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            self.httpd.shutdown()
            self.httpd.server_close()

    def record(self, name: str, data: dict) -> None:
        with self._lock:
            self._records.append((name, data))

    def records(self, name: str) -> list[dict]:
        with self._lock:
            return [data for n, data in self._records if n == name]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def _handler_class(self):
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(PAGES), **kwargs)

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def _die_here(self) -> bool:
                if urlsplit(self.path).path in server.die_on:
                    self.close_connection = True
                    threading.Thread(target=server.stop, daemon=True).start()
                    return True
                return False

            def _send(self, status: int, body: str = "", ctype: str = "text/html; charset=utf-8", headers=()):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                for key, value in headers:
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self._die_here():
                    return
                parts = urlsplit(self.path)
                if parts.path == "/slow":
                    time.sleep(0.4)
                    return self._send(200, "Special offer: half price this week only!", "text/plain")
                if parts.path == "/redirect":  # an open redirect, as many sites have one
                    return self._send(302, "", headers=[("Location", parse_qs(parts.query).get("to", ["/"])[0])])
                if parts.path == "/variant.js":  # what a page built from script data shows this visit
                    return self._send(200, f"window.VARIANT = {json.dumps(server.variant)};", "text/javascript")
                if parts.path.startswith("/site/") and server.site in ("a", "b"):
                    self.path = f"/site-{server.site}/" + self.path.removeprefix("/site/")
                if parts.path == "/welcome":
                    user = parse_qs(parts.query).get("user", [""])[0]
                    return self._send(
                        200,
                        f"<!doctype html><title>Welcome</title><h1>Welcome, {html.escape(user)}</h1>"
                        '<p><a href="/login.html">Sign out</a></p>',
                    )
                return super().do_GET()

            def do_POST(self):
                if self._die_here():
                    return
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                if parts.path == "/login":
                    form = {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}
                    server.record("login", form)
                    where = f"/welcome?user={quote(form.get('username', ''))}"
                    return self._send(303, "", headers=[("Location", where)])
                if parts.path.startswith("/record/"):
                    server.record(parts.path.removeprefix("/record/"), json.loads(raw or "{}"))
                    return self._send(204)
                return self._send(404, "not found")

            def end_headers(self):
                if self.command == "GET" and self.path.endswith(".html"):
                    self.send_header("Cache-Control", "no-store")
                super().end_headers()

        return Handler
