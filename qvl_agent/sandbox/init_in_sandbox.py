"""The first program inside the sandbox (run by `bubblewrap.py`, never imported by qvl-agent).

    python -I init_in_sandbox.py SPEC

SPEC is JSON: {"relays": [[LISTEN_HOST, PORT, SOCKET], ...], "timeout_ms": N or null, "limits": [DATA,
NPROC, FSIZE] or null, "hooks": [PATH, ...], "script": PATH, "argv": [...], "files_fd": FD or null,
"copy_bytes": N}.

It runs with only the standard library and Playwright, in a network namespace whose one interface is its
own loopback. For each relay it listens on LISTEN_HOST:PORT there (the address an origin of the script
names, as this sandbox's /etc/hosts resolves it) and hands every connection to the unix socket SOCKET,
behind which the host-side forwarder reaches that origin and nothing else. With a TIMEOUT_MS it lowers
Playwright's default timeouts, so a wrong locator fails with Playwright's own message before the
verification's timeout ends the run. A browser launched with headless=False runs headless (no display here).
It runs each hook file (features built on the sandbox put their own set-up there), sets the resource limits
(set here, after bubblewrap made the user namespace, the process limit counts only the sandbox's own
processes) and runs the script as `__main__` with `argv` after its name. When the script ends, the regular
files under its working directory go back through FILES_FD (`files_out.py` reads them).

Nothing here is a wall: the script could stop the relay or undo the timeouts, and gain nothing by it.
The walls are the namespaces and the forwarder outside.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import socket
import stat
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


def _headless_only() -> None:
    """There is no display in here: a browser asked for with headless=False (as most people's own scripts
    do) is launched headless instead, with one line saying so, rather than fail to start."""
    try:
        from playwright.sync_api._generated import BrowserType
    except ImportError:
        return  # a script that does not use Playwright
    told = []

    def headless(launch):
        def wrapped(self, *args, **kwargs):
            if kwargs.get("headless") is False:
                kwargs["headless"] = True
                if not told:
                    told.append(True)
                    print("qvl-agent: the script asked for a visible browser; in the sandbox it runs headless.",
                          file=sys.stderr, flush=True)  # fmt: skip
            return launch(self, *args, **kwargs)

        return wrapped

    BrowserType.launch = headless(BrowserType.launch)
    BrowserType.launch_persistent_context = headless(BrowserType.launch_persistent_context)


def _limit(data: int, processes: int, file_size: int) -> None:
    for which, value in (
        (resource.RLIMIT_DATA, data),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))  # soft = hard: nothing inside can raise them again


def send_files(folder: str, fd: int, budget: int, depth: int = 32) -> None:
    """Send the regular files under `folder` (links never followed, at most `depth` folders deep) through
    `fd` as the records `files_out.parse_files` reads, until `budget` bytes of data are sent."""
    stack = [("", 0)]
    with os.fdopen(fd, "wb") as out:
        while stack:
            relative, level = stack.pop()
            try:
                entries = sorted(os.scandir(os.path.join(folder, relative)), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                name = os.path.join(relative, entry.name)
                try:
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        if level < depth:
                            stack.append((name, level + 1))
                        continue
                    if not stat.S_ISREG(info.st_mode) or info.st_size > budget:
                        continue
                    src = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(src, "rb") as f:
                        data = f.read(budget + 1)
                except OSError:
                    continue
                if len(data) > budget:
                    continue
                budget -= len(data)
                encoded = os.fsencode(name)
                out.write(b"F" + len(encoded).to_bytes(4, "big") + encoded + len(data).to_bytes(8, "big") + data)


def main() -> None:
    spec = json.loads(sys.argv[1])
    files_fd = spec.get("files_fd")
    if files_fd is not None:
        os.set_inheritable(files_fd, False)  # the script's own child processes do not get it
    for host, port, path in spec["relays"]:
        _relay(host, int(port), path)
    if spec.get("timeout_ms") is not None:
        _lower_timeouts(float(spec["timeout_ms"]))
    _headless_only()
    for hook in spec.get("hooks", []):
        runpy.run_path(hook, run_name="qvl_sandbox_hook")
    if spec.get("limits"):
        _limit(*(int(n) for n in spec["limits"]))
    script, scratch = spec["script"], os.getcwd()  # the script may change directory; its files stay here
    sys.argv = [script, *spec.get("argv", [])]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout.flush()
        if files_fd is not None:
            try:
                send_files(scratch, files_fd, int(spec.get("copy_bytes", 0)))
            except OSError:
                pass


if __name__ == "__main__":
    main()
