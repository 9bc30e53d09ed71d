"""The first program inside the verification sandbox (run by `sandbox.py`, never imported by qvl-agent).

    python -I sandbox_init.py LISTEN_HOST PORT SOCKET TIMEOUT_MS DATA,NPROC,FSIZE SCRIPT

It runs with only the standard library and Playwright, in a network namespace whose one interface is its
own loopback. It listens on LISTEN_HOST:PORT there (the address the script's URL names, as this sandbox's
/etc/hosts resolves it) and hands every connection to the unix socket SOCKET, behind which the host-side
forwarder reaches the target's origin and nothing else. Then it lowers Playwright's default timeouts to
TIMEOUT_MS, so a wrong locator fails with Playwright's own message before the verification's timeout
ends the run, sets the resource limits (set here, after bubblewrap made the user namespace, the process
limit counts only the sandbox's own processes) and runs SCRIPT as `__main__`.

Nothing here is a wall: the script could stop the relay or undo the timeouts, and gain nothing by it.
The walls are the namespaces and the forwarder outside.
"""

from __future__ import annotations

import resource
import runpy
import socket
import sys
import threading


def pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        conn, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            conn.close()
            upstream.close()
            continue
        threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()


def _relay(host: str, port: int, path: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()


def _lower_timeouts(timeout_ms: float) -> None:
    from playwright.sync_api import expect
    from playwright.sync_api._generated import Browser, BrowserContext

    expect.set_options(timeout=timeout_ms)

    def with_timeout(make):
        def wrapped(*args, **kwargs):
            made = make(*args, **kwargs)
            made.set_default_timeout(timeout_ms)
            return made

        return wrapped

    Browser.new_context = with_timeout(Browser.new_context)
    Browser.new_page = with_timeout(Browser.new_page)
    BrowserContext.new_page = with_timeout(BrowserContext.new_page)


def _limit(data: int, processes: int, file_size: int) -> None:
    for which, value in (
        (resource.RLIMIT_DATA, data),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))  # soft = hard: nothing inside can raise them again


def main() -> None:
    host, port, path, timeout_ms, limits, script = sys.argv[1:7]
    if host:
        _relay(host, int(port), path)
    _lower_timeouts(float(timeout_ms))
    if limits != "-":
        _limit(*(int(n) for n in limits.split(",")))
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
