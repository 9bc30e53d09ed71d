"""Hostile requests against a real uvicorn server on 127.0.0.1: each is refused (or stopped) with the
right status and OpenAI's error JSON, what it tried to cause did not happen, and the server keeps
answering `/health` and an ordinary request while the hostile one is in flight or being refused."""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
import threading
import time

import httpx
import pytest
from PIL import Image

from qvl_agent.config import Settings
from qvl_agent.server.app import create_app
from tests.support.live_server import EchoEngine, LiveServer

TOKEN = "hostile-test-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SETTINGS = Settings(model="qvl-test-model")
GENEROUS_S = 10.0  # the client-side timeout for requests that must keep working; timings are printed


def serve(engine=None, token=TOKEN, config=None, **kw):
    return LiveServer(create_app(engine or EchoEngine(), SETTINGS, token=token, **kw), **(config or {}))


def png_url(width=64, height=48, color=(200, 30, 30)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def user(text, *images):
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}] if images else text}


def post(url, body, headers=AUTH, timeout=60.0):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(url + "/v1/chat/completions", content=data, headers=headers, timeout=timeout)


def responsive(url, headers=AUTH) -> tuple[float, float]:
    """/health and an ordinary request both answer; returns their latencies in seconds."""
    start = time.perf_counter()
    assert httpx.get(url + "/health", timeout=GENEROUS_S).json()["status"] == "ok"
    health = time.perf_counter() - start
    start = time.perf_counter()
    ok = post(url, {"messages": [user("still there?")], "max_tokens": 3}, headers=headers, timeout=GENEROUS_S)
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"].startswith("echo:still there?")
    return health, time.perf_counter() - start


def while_in_flight(url, hostile, headers=AUTH) -> tuple:
    """Run `hostile()` in a thread and check the server stays responsive meanwhile; (its result, health
    latency, ordinary latency, hostile's own time)."""
    out: dict = {}

    def run():
        start = time.perf_counter()
        try:
            out["result"] = hostile()
        except Exception as exc:  # the test asserts on it
            out["result"] = exc
        out["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.05)
    health, ordinary = responsive(url, headers)
    thread.join(60)
    assert not thread.is_alive()
    print(f"\nhealth {health * 1000:.0f} ms, ordinary {ordinary * 1000:.0f} ms, hostile {out['seconds'] * 1000:.0f} ms")
    return out["result"], health, ordinary, out["seconds"]


@pytest.fixture()
def server_log():
    """Records what the server and uvicorn log, to check that bad input leaves no traceback."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "qvl_agent")]
    for logger in loggers:
        logger.addHandler(handler)
    yield records
    for logger in loggers:
        logger.removeHandler(handler)


def no_traceback(records) -> None:
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]


# --- one request cannot hold the engine ----------------------------------------------------------------


def test_a_prompt_over_the_token_cap_is_400_with_the_figure_and_the_engine_never_runs():
    engine = EchoEngine()
    with serve(engine, max_prompt_tokens=2_000) as url:
        words = " ".join(f"w{i}" for i in range(1_000_000))  # the red team's million-word prompt
        r, *_ = while_in_flight(url, lambda: post(url, {"messages": [user(words)]}))
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert "2,000 tokens" in r.json()["error"]["message"]
        assert all(turn.text != words for session in engine.sessions for turn in session.turns)
        assert engine.tokenizer.calls < 10  # counted slice by slice and stopped early, not the whole body


@pytest.mark.parametrize(
    "stop",
    ["x" * 5_000_000, ["a", "b", "c", "d", "e"], ""],
    ids=["5 MB stop string", "five stop strings", "empty stop string"],
)
def test_stop_strings_are_capped(stop):
    with serve() as url:
        r, *_ = while_in_flight(url, lambda: post(url, {"messages": [user("x")], "stop": stop}))
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def test_too_many_images_or_pixels_in_one_request_are_413_before_any_decoding(monkeypatch):
    from qvl_agent.server import images as images_module

    decoded: list[str] = []
    real = images_module.load_image_bytes
    monkeypatch.setattr(images_module, "load_image_bytes", lambda data, **kw: decoded.append("x") or real(data, **kw))
    with serve(max_images=4, max_total_pixels=300 * 300) as url:
        many = [png_url(16, 16, (i, 0, 0)) for i in range(5)]
        r, *_ = while_in_flight(url, lambda: post(url, {"messages": [user("x", *many)]}))
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_images"
        assert decoded == []
        big = [png_url(200, 200, (i, 9, 9)) for i in range(3)]  # 120,000 pixels in all, each within the cap
        r = post(url, {"messages": [user("x", *big)]})
        assert r.status_code == 413 and "add up to more than 90,000 pixels" in r.json()["error"]["message"]
        assert len(decoded) <= 2  # the third image was refused from its header


def test_images_are_decoded_only_once_the_queue_admits_the_request(monkeypatch):
    from qvl_agent.server import images as images_module

    decoded: list[str] = []
    real = images_module.load_image_bytes
    monkeypatch.setattr(images_module, "load_image_bytes", lambda data, **kw: decoded.append("x") or real(data, **kw))
    engine = EchoEngine()
    engine.gate = threading.Event()  # the first request holds the engine until the probe was refused
    with serve(engine, max_queue=1) as url:
        slow = {"messages": [user("one two three four five six")]}
        busy = [threading.Thread(target=post, args=(url, slow), daemon=True) for _ in range(2)]
        # One held on the engine, then one waiting: a state that stays put. The second starts only once
        # the first runs, or on a busy machine both could reach the one-place queue together (one 429).
        for t, (running, waiting) in zip(busy, [(1, 0), (1, 1)], strict=True):
            t.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                health = httpx.get(url + "/health").json()
                if health["running"] == running and health["queue_depth"] == waiting:
                    break
                time.sleep(0.02)
        try:
            r = post(url, {"messages": [user("x", png_url(300, 300, (1, 2, 3)))]})
        finally:
            engine.gate.set()
        assert r.status_code == 429
        assert decoded == []  # refused at the door: its image was never decoded
        for t in busy:
            t.join(30)
        responsive(url)


def test_a_client_that_leaves_during_prefill_frees_the_engine_and_the_next_request_runs():
    engine = EchoEngine(prefill_s=30.0)
    with serve(engine) as url:
        long_text = "describe every pixel"
        with pytest.raises(httpx.ReadTimeout):
            post(url, {"messages": [user(long_text)]}, timeout=1.0)
        deadline = time.monotonic() + 10
        while long_text not in engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.cancelled == [long_text]  # stopped in prefill, long before its 30 s
        engine.prefill_s = 0.0
        responsive(url)


def test_a_timeout_during_prefill_answers_504_and_frees_the_engine():
    engine = EchoEngine(prefill_s=30.0)
    with serve(engine, request_timeout_s=1.0) as url:
        r = post(url, {"messages": [user("slow prefill")]})
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        deadline = time.monotonic() + 10
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.cancelled == ["slow prefill"]
        engine.prefill_s = 0.0
        responsive(url)


# --- malformed input ------------------------------------------------------------------------------------


MALFORMED = [
    ("100,000 nested [", b"[" * 100_000),
    ("5,000-digit integer", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + b"9" * 5000 + b"}"),
    ("lone surrogate", b'{"messages": [{"role": "user", "content": "a \\ud800 b"}]}'),
    ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "a \xed\xa0\x80 b"}]}'),
    ("not an object", b"[1, 2, 3]"),
]


@pytest.mark.parametrize("body", [b for _, b in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_malformed_json_is_400_without_a_traceback(body, server_log):
    with serve() as url:
        r, *_ = while_in_flight(url, lambda: post(url, body))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_json"
    no_traceback(server_log)


# --- /metrics -------------------------------------------------------------------------------------------


def test_metrics_stay_parseable_and_bounded_under_hostile_paths():
    from prometheus_client.parser import text_string_to_metric_families

    with serve() as url:
        with httpx.Client(base_url=url, timeout=GENEROUS_S) as client:
            for path in ['/a"b', "/a\\b", "/x%0Ay", '/"}} qvl_fake 1 #', "/v1/models/../x"]:
                client.get(path)
            for i in range(300):
                client.get(f"/unique-{i}")
        responsive(url)
        text = httpx.get(url + "/metrics", headers=AUTH).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = families["qvl_requests"]
    endpoints = {s.labels["endpoint"] for s in requests.samples if s.name == "qvl_requests_total"}
    assert endpoints <= {"/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "other"}
    assert "qvl_fake" not in families
    others = [s for s in requests.samples if s.name == "qvl_requests_total" and s.labels["endpoint"] == "other"]
    assert sum(s.value for s in others) >= 305
    assert len(text) < 20_000  # 305 unknown paths added one series, not 305


# --- image URLs -----------------------------------------------------------------------------------------


class Canary:
    """An HTTP server on 127.0.0.1 that records every request it gets (and can redirect)."""

    def __init__(self, redirect_to: str | None = None):
        import http.server

        hits = self.hits = []
        png = base64.b64decode(png_url(8, 8).split(",")[1])

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                self.wfile.write(png)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_image_urls_to_loopback_in_any_spelling_are_refused_and_never_fetched():
    canary = Canary()
    p = canary.port
    try:
        with serve(allow_image_urls=True) as url:
            spellings = [
                f"http://127.0.0.1:{p}/a.png",
                f"http://localhost:{p}/a.png",
                f"http://2130706433:{p}/a.png",  # decimal
                f"http://0177.0.0.1:{p}/a.png",  # octal
                f"http://0x7f.0.0.1:{p}/a.png",  # hex
                f"http://127.1:{p}/a.png",
                f"http://[::1]:{p}/a.png",
                f"http://[::ffff:127.0.0.1]:{p}/a.png",
                f"http://0.0.0.0:{p}/a.png",
            ]
            messages = set()
            for spelling in spellings:
                r, *_ = while_in_flight(url, lambda s=spelling: post(url, {"messages": [user("x", s)]}))
                assert r.status_code == 400 and r.json()["error"]["code"] == "image_fetch_failed", spelling
                messages.add(r.json()["error"]["message"])
            assert len(messages) == 1  # one generic sentence
        assert canary.hits == []
    finally:
        canary.close()


def test_every_redirect_is_checked_and_failures_all_read_the_same():
    """With a policy that allows only the redirector's port, a redirect to the canary is refused; a
    closed port, a 404 and a refused address give the same sentence (no port-scanner oracle)."""
    from qvl_agent.server.fetch import ImageFetcher, is_public
    from qvl_agent.server.protocol import ApiError

    canary = Canary()
    redirector = Canary(redirect_to=f"http://2130706433:{canary.port}/secret.png")
    try:
        fetcher = ImageFetcher(1_000_000, allow=lambda address, port: port == redirector.port)
        with pytest.raises(ApiError) as refused:
            fetcher.fetch(f"http://127.0.0.1:{redirector.port}/start.png", "p")
        assert redirector.hits == ["/start.png"] and canary.hits == []

        loose = ImageFetcher(1_000_000, allow=lambda address, port: True)
        assert loose.fetch(f"http://127.0.0.1:{canary.port}/ok.png", "p").startswith(b"\x89PNG")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        with pytest.raises(ApiError) as closed_port:
            loose.fetch(f"http://127.0.0.1:{closed}/x.png", "p")
        assert refused.value.message == closed_port.value.message
    finally:
        canary.close()
        redirector.close()
    import ipaddress

    for private in ("10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "224.0.0.1", "fe80::1", "fc00::1"):
        assert not is_public(ipaddress.ip_address(private), 80), private
    # IPv6 spellings of private IPv4 addresses that a NAT64 or 6to4 gateway, or the kernel, would deliver
    embedded = ("64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "2002:c0a8:101::1", "::127.0.0.1", "::ffff:0:a00:1")
    for private in (*embedded, "fec0::1"):
        assert not is_public(ipaddress.ip_address(private), 80), private
    for public in ("93.184.216.34", "64:ff9b::5db8:d822", "2002:5db8:d822::1", "2606:4700:4700::1111"):
        assert is_public(ipaddress.ip_address(public), 80), public


# --- --no-token: cross-site requests and DNS rebinding --------------------------------------------------


def test_without_a_token_cross_site_posts_and_foreign_hosts_are_refused():
    engine = EchoEngine()
    with serve(engine, token=None) as url:
        body = json.dumps({"messages": [user("delete everything")]})
        form = httpx.post(url + "/v1/chat/completions", content=body, headers={"Content-Type": "text/plain"})
        assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
        rebound = httpx.post(
            url + "/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json", "Host": "attacker.example:8000"},
        )
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
        assert httpx.get(url + "/v1/models", headers={"Host": "attacker.example"}).status_code == 403
        assert engine.sessions == []  # neither reached the model
        for host in (f"localhost:{url.rsplit(':', 1)[1]}", "127.0.0.1", "[::1]:80"):
            assert httpx.get(url + "/v1/models", headers={"Host": host}).status_code == 200
        responsive(url, headers={})


# --- slow and broken clients ----------------------------------------------------------------------------


def raw_connect(url) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=GENEROUS_S)


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_clients_trickling_their_request_head_are_cut_off(server_log):
    with serve(config={"head_timeout_s": 1.0}) as url:
        socks = [raw_connect(url) for _ in range(50)]
        for sock in socks:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        stop = time.monotonic() + 2.0
        while time.monotonic() < stop:  # one header byte at a time, as the red team's clients did
            for sock in socks:
                try:
                    sock.sendall(b"X")
                except OSError:
                    pass
            time.sleep(0.2)
        health, ordinary = responsive(url)
        assert all(closed_by_server(sock, GENEROUS_S) for sock in socks)
        for sock in socks:
            sock.close()
    no_traceback(server_log)


def test_a_trickled_body_gets_408_and_a_disconnect_mid_body_is_one_line(server_log):
    with serve(body_timeout_s=1.0) as url:
        sock = raw_connect(url)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"messages": ')
        sock.settimeout(GENEROUS_S)
        answer = ""
        while "\r\n\r\n" not in answer or not answer.rstrip().endswith("}"):
            data = sock.recv(4096)
            if not data:
                break
            answer += data.decode()
        assert answer.startswith("HTTP/1.1 408") and "request_timeout" in answer
        sock.close()

        gone = raw_connect(url)
        gone.sendall(head.encode() + b'{"messages": [')
        time.sleep(0.2)
        gone.close()
        time.sleep(0.5)
        responsive(url)
    no_traceback(server_log)
    lines = [
        r.getMessage() for r in server_log if "disconnected before sending the whole request body" in r.getMessage()
    ]
    assert len(lines) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [user("hi")] * 300_000},  # 10 MB of tiny messages
        {"messages": [{"role": "user", "content": [1] * 1_000_000}]},  # 3 MB: a million invalid parts
        {"messages": [user("hi")], "stop": [1] * 1_000_000},
    ],
    ids=["many-messages", "many-parts", "many-stops"],
)
def test_a_body_of_millions_of_tiny_values_is_413_while_health_keeps_answering(body):
    """Validating millions of values holds the interpreter lock for seconds; such a body is refused
    before validation, and /health and an ordinary request answer while it is being refused."""
    data = json.dumps(body)
    with serve() as url:
        answers = []
        hostile = threading.Thread(target=lambda: answers.append(post(url, data)))
        hostile.start()
        while hostile.is_alive():
            responsive(url)
        hostile.join()
        (answer,) = answers
        assert answer.status_code == 413, answer.text[:200]
        error = answer.json()["error"]
        assert "100,000 JSON values" in error["message"] and error["code"] == "request_too_large"
        responsive(url)
