"""A real uvicorn server on 127.0.0.1 in a thread, and an echo engine whose every reply names its request.

The echo engine answers `echo:<text>|images:<hashes>|turns:<n>` word by word (optionally slowly), so a
test can tell that each reply belongs to its own request, that history reached the session, and that
a cancelled generation really stopped.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from qvl_agent.engine.base import Engine, Session, TurnStats
from qvl_agent.errors import GenerationCancelled
from qvl_agent.server.transport import uvicorn_config


class WordTokenizer:
    """A stand-in for a tokenizer: one token per whitespace-separated word."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        return [0] * len(text.split())


class EchoEngine(Engine):
    """`delay_s` per word; `prefill_s` before the first word, spent in short slices that each check for
    cancellation, as the local engine's chunked prefill does. While `gate` is an unset Event, every
    generation waits before its first word: a test holds the engine busy for exactly as long as it needs."""

    def __init__(self, delay_s: float = 0.0, name: str = "echo", prefill_s: float = 0.0):
        self.name = name
        self.delay_s = delay_s
        self.prefill_s = prefill_s
        self.gate: threading.Event | None = None
        self.tokenizer = WordTokenizer()
        self.sessions: list[EchoSession] = []
        self.cancelled: list[str] = []  # texts whose generation was cancelled
        self.options: list = []  # the GenerationOptions of every turn, in order
        self.active = 0
        self.max_active = 0  # generations running at the same time, ever: must stay 1
        self._lock = threading.Lock()

    def open_session(self, images=(), system=None, tools=None):
        session = EchoSession(self, images, system, tools)
        self.sessions.append(session)
        return session


class EchoSession(Session):
    def __init__(self, engine, images, system, tools):
        super().__init__(images, system, tools)
        self.engine = engine
        self.seen_tokens = 0  # words "in the KV cache": what a follow-up does not prefill again

    def _generate(self, text, images, options):
        engine = self.engine
        engine.options.append(options)
        with engine._lock:
            engine.active += 1
            engine.max_active = max(engine.max_active, engine.active)
        finished = False
        try:
            start = time.perf_counter()
            context = sum(len(t.text.split()) + len(t.reply.split()) + len(t.images) for t in self.turns)
            context += len(text.split()) + len(images)
            cached = min(self.seen_tokens, context)
            hashes = ",".join(im.content_hash[:8] for im in images)
            words = f"echo:{text}|images:{hashes}|turns:{len(self.turns)}".split(" ")
            words = words[: options.max_new_tokens]
            prefill_end = time.monotonic() + engine.prefill_s
            while time.monotonic() < prefill_end:
                if self.cancelled:
                    raise GenerationCancelled("The answer was stopped during prefill.")
                time.sleep(0.02)
            while engine.gate is not None and not engine.gate.wait(0.02):
                if self.cancelled:
                    raise GenerationCancelled("The answer was stopped while the engine was held.")
            for i, word in enumerate(words):
                if self.cancelled:
                    raise GenerationCancelled("The answer was stopped.")
                if engine.delay_s:
                    time.sleep(engine.delay_s)
                yield word if i == 0 else " " + word
            self.seen_tokens = context + len(words)
            end = time.perf_counter()
            self.last_stats = TurnStats(
                vision="miss" if images else "none",
                prefill_tokens=context - cached,
                prompt_tokens=context,
                cached_tokens=cached,
                decode_tokens=len(words),
                ttft_ms=(end - start) * 1000,
                total_ms=(end - start) * 1000,
            )
            finished = True
        finally:
            if not finished:  # stopped by cancel() or by the caller closing the stream
                engine.cancelled.append(text)
            with engine._lock:
                engine.active -= 1


class LiveServer:
    """`with LiveServer(app) as base_url:` — the app served on a free port of 127.0.0.1."""

    def __init__(self, app, **config):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def start_serve(
    *args: str,
    config_dir,
    token: str | None = "tiny-test-token-0123",
    env: dict | None = None,
    timeout: float = 180,
):
    """Start `python -m qvl_agent serve --port 0 ARGS` as a user would; returns (base URL, process, lines
    printed). The caller stops it with `stop_serve`."""
    import os
    import queue
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent.parent
    # The checkout first; packages carried onto a machine (a PYTHONPATH already set) stay importable.
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", QVL_CONFIG_DIR=str(config_dir), **(env or {}))
    env.pop("QVL_API_TOKEN", None)
    if token:
        env["QVL_API_TOKEN"] = token
    proc = subprocess.Popen(
        [sys.executable, "-m", "qvl_agent", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=root,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    printed: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        printed.append(line.rstrip("\n"))
        if line.startswith("Chat page: "):
            url = line.split()[2].split("/?")[0].rstrip("/")
            return url, proc, printed
    proc.kill()
    raise RuntimeError("qvl-agent serve did not start:\n" + "\n".join(printed))


def stop_serve(proc) -> int:
    """Ctrl+C, as a person would; returns the exit code."""
    import signal

    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(60)  # a loaded machine takes its time to unwind a torch process
    except Exception:
        proc.kill()
        raise
