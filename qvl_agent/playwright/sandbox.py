"""Run a model-written Playwright script inside a bubblewrap sandbox.

`run_sandboxed(source, url=..., browser=..., timeout_s=...)` runs the script with its own fresh Chromium
and returns how it ended, its last output and the files it wrote. What the script can touch:

- **Files:** a new mount namespace holding the system folders (/usr and the /etc entries that Chromium
  and Python need), the Python installation, the browser and Playwright's driver, all read-only; no home
  folder, no host /tmp (a size-capped tmpfs instead). The scratch folder, its working directory, is the one
  writable place on disk. A page's own file:// target is bound read-only, alone.
- **Processes:** a new PID namespace that dies with the parent (`--die-with-parent`): when the timeout
  kills bubblewrap, the kernel ends every process inside. A new session (no terminal to type into), all
  capabilities dropped (only CAP_NET_BIND_SERVICE, scoped to the sandbox's own user and network
  namespaces, when the target's port is below 1024).
- **Resources:** memory per process (RLIMIT_DATA: Chromium and V8 reserve tens of GB of address space
  they never touch, so RLIMIT_AS would stop Chromium from starting), processes and threads (RLIMIT_NPROC,
  counted inside the sandbox's user namespace; the kernel exempts root), bytes per file written
  (RLIMIT_FSIZE), no core files. Output goes to a file capped by that limit, never into a pipe to this
  process: only its last bytes are read back. What no kernel limit holds (processes when run as root, the
  scratch folder's total size) `sandbox_watch.Watchdog` checks from outside, ending the run past a limit.
- **Network:** a new network namespace whose only interface is its own loopback. The script's URL names
  a host; inside, /etc/hosts maps that host to loopback and `sandbox_init.py` listens on its port, handing
  each connection to a unix socket bound in from here. Behind that socket this module connects to the
  target's address, resolved once before the run (a DNS answer cannot change where it goes), and to
  nothing else. So the same URL works unchanged inside, whatever browser flags or HTTP client the script
  uses; any other port on loopback, any other host, the host's private and link-local addresses and its
  abstract unix sockets (X11, D-Bus) do not exist in there. The forwarder is a plain TCP relay, so TLS
  stays end to end. (The alternative, Chromium's --proxy-server and --host-resolver-rules, would need the
  script to launch Chromium our way and would leave Playwright's own HTTP client outside the rule.)
- **Environment:** six variables: PATH, HOME=/tmp, TMPDIR=/tmp, LANG, QVL_BROWSER, PYTHONDONTWRITEBYTECODE.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from qvl_agent.errors import SandboxUnavailable
from qvl_agent.playwright.sandbox_init import pipe as _pipe  # the same byte relay runs on both sides
from qvl_agent.playwright.sandbox_watch import Watchdog, remove_tree, walk

PACKAGE = "bubblewrap"
INIT = Path(__file__).with_name("sandbox_init.py")
INIT_INSIDE = "/sandbox/init.py"  # where INIT lies inside the sandbox
SCRIPT_INSIDE = "/sandbox/script.py"  # and the script

MEMORY_BYTES = 4 << 30  # heap per process (RLIMIT_DATA)
PROCESSES = 1024  # processes and threads of the sandbox's user (RLIMIT_NPROC)
FILE_BYTES = 64 << 20  # largest file the script may write, its output log included (RLIMIT_FSIZE)
TMPFS_BYTES = 256 << 20  # /tmp and /dev/shm inside, each
OUTPUT_TAIL_BYTES = 16384  # what is read back from the output log
COPY_BYTES = 64 << 20  # files copied back from the scratch folder, in all
MAX_CONNECTIONS = 64  # open connections through the forwarder at once

# /etc entries that Python, Chromium (Debian's launcher script reads /etc/chromium.d) and fontconfig read.
# Only world-readable ones: as root, the sandbox's uid 0 is the owner of root's 0700 files.
_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "fonts",
    "ssl/certs",  # not /etc/ssl itself: ssl/private holds the host's private keys
    "ssl/openssl.cnf",
    "ca-certificates",
    "nsswitch.conf",
    "localtime",
    "mime.types",
    "chromium",
    "chromium.d",
)


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # None when the timeout ended it
    output: str  # the last OUTPUT_TAIL_BYTES of stdout and stderr together
    files: dict[str, bytes] = field(default_factory=dict)  # scratch-relative path -> content
    seconds: float = 0.0
    limit: str = ""  # why the watchdog ended it early ("it ran more than ..."), else empty


def bubblewrap_problem() -> str | None:
    """Why verification cannot be sandboxed here (one sentence naming the package), or None when it can."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap is not installed: install the package `{PACKAGE}` (e.g. apt install {PACKAGE})."
    probe = subprocess.run(
        [bwrap, *_system_binds(), "--unshare-all", "--unshare-user", "--die-with-parent", "--", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        return f"bubblewrap (package `{PACKAGE}`) cannot start a sandbox here: {why}."
    return None


def run_sandboxed(source: str, *, url: str, browser: str, timeout_s: float, default_timeout_ms: float) -> SandboxResult:
    """Run `source` in the sandbox with `url`'s origin as its only network peer; see the module docstring.

    Raises SandboxUnavailable when bubblewrap is missing or cannot start."""
    problem = bubblewrap_problem()
    if problem:
        raise SandboxUnavailable(problem)
    target = urlsplit(url)
    work_dir = Path(tempfile.mkdtemp(prefix="qvl-sandbox-"))
    try:
        scratch = work_dir / "scratch"
        scratch.mkdir()
        (work_dir / "script.py").write_text(source, encoding="utf-8")
        forwarder = None
        binds: list[str] = []
        if target.scheme in ("http", "https"):
            forwarder = _Forwarder(work_dir / "net.sock", target)
            listen, hosts = _inside_addresses(target.hostname or "")
            (work_dir / "hosts").write_text(hosts, encoding="utf-8")
            binds += ["--ro-bind", str(work_dir / "hosts"), "/etc/hosts"]
            binds += ["--ro-bind", str(forwarder.path), "/sandbox/net.sock"]
            port = target.port or (443 if target.scheme == "https" else 80)
        else:
            listen, port = "", 0
            if target.scheme == "file" and Path(target.path).is_file():
                binds += ["--ro-bind", target.path, target.path]
        command = [
            shutil.which("bwrap") or "bwrap",
            *_system_binds(),
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--cap-drop",
            "ALL",
            *(["--cap-add", "CAP_NET_BIND_SERVICE"] if port and port < 1024 else []),
            "--die-with-parent",
            "--new-session",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(TMPFS_BYTES),
            "--tmpfs",
            "/tmp",
            "--size",
            str(TMPFS_BYTES),
            "--tmpfs",
            "/dev/shm",
            # After the tmpfs mounts, which would otherwise hide a Python, browser or page under /tmp.
            *_python_and_browser_binds(browser),
            *binds,
            "--bind",
            str(scratch),
            "/scratch",
            "--ro-bind",
            str(work_dir / "script.py"),
            SCRIPT_INSIDE,
            "--ro-bind",
            str(INIT),
            INIT_INSIDE,
            "--chdir",
            "/scratch",
            "--",
            sys.executable,
            "-I",
            INIT_INSIDE,
            listen,
            str(port),
            "/sandbox/net.sock",
            f"{default_timeout_ms:g}",
            f"{MEMORY_BYTES},{PROCESSES},{FILE_BYTES}",
            SCRIPT_INSIDE,
        ]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "QVL_BROWSER": browser,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        log_path = work_dir / "output.log"
        info_read, info_write = os.pipe()  # bubblewrap writes {"child-pid": N} here: the namespace's first process
        command[1:1] = ["--info-fd", str(info_write)]
        started = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                pass_fds=(info_write,),
            )  # fmt: skip
        os.close(info_write)
        watchdog = Watchdog(proc, info_read, scratch)
        watchdog.start()
        if forwarder is not None:
            forwarder.start()
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # bubblewrap's children die with it (--die-with-parent), and with the namespace's first process
            # every other process inside goes too.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
        finally:
            watchdog.stop()
            if forwarder is not None:
                forwarder.stop()
        if returncode is None or watchdog.reason:
            _wait_for_namespace_end(watchdog.child_pid)
        seconds = time.monotonic() - started
        return SandboxResult(returncode, read_tail(log_path), collect_files(scratch), seconds, watchdog.reason)
    finally:
        remove_tree(work_dir)  # not TemporaryDirectory: shutil.rmtree recurses, and the script chose the depth


def _wait_for_namespace_end(pid: int | None, limit_s: float = 10.0) -> None:
    """Wait until the sandbox's first process `pid` has exited. It dies with bubblewrap (--die-with-parent),
    and the kernel lets the first process of a PID namespace finish exiting only once every other process in
    it is gone: after this, nothing the script started is left."""
    deadline = time.monotonic() + limit_s
    while pid and time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return  # gone and reaped
        if state in ("Z", "X"):
            return
        time.sleep(0.02)


def _system_binds() -> list[str]:
    binds = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            binds += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            binds += ["--ro-bind", str(path), str(path)]
    for name in _ETC:
        binds += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return binds


def _python_and_browser_binds(browser: str) -> list[str]:
    """Read-only binds for this Python (its installation and its environment's packages, Playwright's
    driver among them) and the browser's folder, where they lie outside /usr."""
    import playwright

    wanted = {Path(sys.base_prefix), Path(sys.prefix), Path(playwright.__file__).resolve().parent.parent}
    resolved = Path(browser).resolve()
    wanted.add(resolved.parent)
    binds: list[str] = []
    for path in sorted(wanted):
        if not path.is_relative_to("/usr") and path.exists():
            binds += ["--ro-bind", str(path), str(path)]
    if Path(browser) != resolved and not Path(browser).is_relative_to("/usr"):
        binds += ["--ro-bind", browser, browser]
    return binds


def _inside_addresses(host: str) -> tuple[str, str]:
    """Where the relay listens inside, and the sandbox's /etc/hosts, for the target's `host`."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "127.0.0.1", f"127.0.0.1 localhost {host}\n"
    if not address.is_loopback:
        raise SandboxUnavailable(
            f"Verification can reach a page by host name or a loopback address, not by the address {host}."
        )
    return str(address), "127.0.0.1 localhost\n"


def read_tail(path: Path) -> str:
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - OUTPUT_TAIL_BYTES))
        return f.read().decode("utf-8", "replace")


def collect_files(scratch: Path) -> dict[str, bytes]:
    """The regular files the script left in the scratch folder, up to COPY_BYTES in all. Symbolic links are
    never followed: one pointing outside would otherwise be read here, outside the sandbox."""
    files: dict[str, bytes] = {}
    budget = COPY_BYTES
    for path, info in walk(scratch):
        if not stat.S_ISREG(info.st_mode):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = f.read(budget + 1)
        if len(data) > budget:
            return files
        budget -= len(data)
        files[str(path.relative_to(scratch))] = data
    return files


class _Forwarder:
    """The sandbox's one way out: a unix socket whose every connection is relayed to the target's origin."""

    def __init__(self, path: Path, target) -> None:
        port = target.port or (443 if target.scheme == "https" else 80)
        # Resolved once, now: the sandbox cannot steer a later lookup elsewhere. A name that does not resolve
        # leaves no address: the script's connections then fail, and its own error says so.
        try:
            found = socket.getaddrinfo(target.hostname, port, type=socket.SOCK_STREAM)
        except OSError:
            found = []
        self.addresses = [info[4][:2] for info in found]
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(MAX_CONNECTIONS)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.stopped = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="qvl-sandbox-forwarder", daemon=True).start()

    def stop(self) -> None:
        self.stopped = True
        self.listener.close()
        with self.lock:
            for s in self.open:
                _close(s)

    def _accept(self) -> None:
        while not self.stopped:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                inside.close()
                continue
            threading.Thread(target=self._relay, args=(inside,), daemon=True).start()

    def _relay(self, inside: socket.socket) -> None:
        outside = None
        try:
            for address in self.addresses:
                try:
                    outside = socket.create_connection(address, timeout=10)
                    outside.settimeout(None)
                    break
                except OSError:
                    continue
            if outside is None:
                return
            with self.lock:
                if self.stopped:
                    return
                self.open.update((inside, outside))
            back = threading.Thread(target=_pipe, args=(outside, inside), daemon=True)
            back.start()
            _pipe(inside, outside)
            back.join()
        finally:
            for s in (inside, outside):
                if s is not None:
                    _close(s)
                    with self.lock:
                        self.open.discard(s)
            self.slots.release()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
