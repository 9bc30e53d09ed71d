"""Run a Playwright script inside a bubblewrap sandbox: every run of a saved or model-written script.

`run_sandboxed(source, origins=..., browser=..., timeout_s=...)` runs the script with its own fresh Chromium
and returns how it ended, its last output and the files it wrote. Verification (`scripts.write.writer.verify_script`),
`qvl-agent replay` (`scripts/replay.py`), the tray and the MCP server all run scripts through it; no path runs
model-written code without it unless the person names `--unsafe-verify`. What the script can touch:

- **Files:** a new mount namespace holding the system folders (/usr and the /etc entries that Chromium
  and Python need), the Python installation, the browser and Playwright's driver, all read-only; no home
  folder, no host /tmp. After set-up the root itself and /dev are remounted read-only (`--remount-ro`:
  bubblewrap's root is a tmpfs no `--size` reaches), so the only writable places are three tmpfs mounts
  of a fixed size (`--size`): /tmp, /dev/shm and the scratch folder /scratch, the working directory. The
  kernel refuses bytes past their size, files unlinked while still open included, and the host's disk
  never holds them. When the script ends, the files under /scratch come back through a pipe
  (`files_out.py`), at most COPY_BYTES; where they go is `copy_back.py`'s rule. A page's own file://
  target is bound read-only, alone, when the caller asks.
- **Processes:** a new PID namespace that dies with the parent (`--die-with-parent`): when the timeout
  kills bubblewrap, the kernel ends every process inside. A new session (no terminal to type into), all
  capabilities dropped (only CAP_NET_BIND_SERVICE, scoped to the sandbox's own user and network
  namespaces, when an origin's port is below 1024). A seccomp filter (`seccomp.py`) lets no
  process make a user namespace again, so none makes a PID, mount or network namespace of its own either.
- **Resources:** where a cgroup can be made (`cgroup.py`), the kernel holds the memory of all the run's
  processes together (shared memory, memfds in flight, socket buffers and tmpfs files included) and the
  number of its processes and threads, root's too. Besides: memory per process (RLIMIT_DATA: Chromium
  and V8 reserve tens of GB of address space they never touch, so RLIMIT_AS would stop Chromium from
  starting), processes and threads (RLIMIT_NPROC, counted inside the sandbox's user namespace; the kernel
  exempts root), bytes per file written (RLIMIT_FSIZE, which also caps each memfd), no core files. Output
  goes to a file capped by that limit, never into a pipe to this process: only its last bytes are read
  back. `watchdog.Watchdog` checks from outside what no kernel limit holds (the number of files) and,
  where no cgroup can be made, the memory and processes of the whole run too, ending it past a limit.
- **Network:** a new network namespace whose only interface is its own loopback. Each origin the script
  may reach names a host; inside, /etc/hosts maps that host to a loopback address of its own and
  `init_in_sandbox.py` listens on its port there, handing each connection to a unix socket bound in from
  here. Behind each socket this module connects to that origin's address, resolved once before the run (a
  DNS answer cannot change where it goes), and to nothing else. So the same URLs work unchanged inside,
  whatever browser flags or HTTP client the script uses; any other port on loopback, any other host, the
  host's private and link-local addresses and its abstract unix sockets (X11, D-Bus) do not exist in
  there. The forwarder is a plain TCP relay, so TLS stays end to end. (The alternative, Chromium's
  --proxy-server and --host-resolver-rules, would need the script to launch Chromium our way and would
  leave Playwright's own HTTP client outside the rule.)
- **Environment:** six variables: PATH, HOME=/tmp, TMPDIR=/tmp, LANG, QVL_BROWSER, PYTHONDONTWRITEBYTECODE;
  plus, for a replayed script, the `QVL_SECRET_*` variables it reads (`env`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from qvl_agent.errors import SandboxUnavailable
from qvl_agent.sandbox.cgroup import Cgroup
from qvl_agent.sandbox.files_out import FileReceiver
from qvl_agent.sandbox.launch import can_size_entries, launcher
from qvl_agent.sandbox.net import Forwarder, inside_addresses, port_of
from qvl_agent.sandbox.seccomp import filter_program
from qvl_agent.sandbox.watchdog import Watchdog, memory_limit_reason, remove_tree

PACKAGE = "bubblewrap"
INIT = Path(__file__).with_name("init_in_sandbox.py")
INIT_INSIDE = "/sandbox/init.py"  # where INIT lies inside the sandbox
SCRIPT_INSIDE = "/sandbox/script.py"  # and the script

MEMORY_BYTES = 4 << 30  # heap per process (RLIMIT_DATA)
PROCESSES = 1024  # processes and threads of the sandbox's user (RLIMIT_NPROC)
FILE_BYTES = 64 << 20  # largest file the script may write, its output log included (RLIMIT_FSIZE)
TMPFS_BYTES = 256 << 20  # /tmp and /dev/shm inside, each (tmpfs, sized)
SCRATCH_BYTES = 256 << 20  # the scratch folder, the script's working directory (tmpfs, sized)
OUTPUT_TAIL_BYTES = 16384  # what is read back from the output log
COPY_BYTES = 64 << 20  # files copied back from the scratch folder, in all

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


@dataclass(frozen=True)
class Bind:
    """One more host path shown inside (for features built on the sandbox, e.g. a socket of their own)."""

    source: str
    dest: str
    writable: bool = False


def bubblewrap_problem() -> str | None:
    """Why verification cannot be sandboxed here (one sentence naming the package), or None when it can."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap is not installed: install the package `{PACKAGE}` (e.g. apt install {PACKAGE})."
    if filter_program() is None:
        return f"the sandbox has no seccomp filter for this machine ({platform.machine()})."
    seccomp = _seccomp_fd()
    try:
        probe = subprocess.run(
            [bwrap, *_system_binds(), *_NAMESPACES, "--seccomp", str(seccomp), "--die-with-parent", "--", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(seccomp,),
        )
    finally:
        os.close(seccomp)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        return f"bubblewrap (package `{PACKAGE}`) cannot start a sandbox here: {why}."
    return None


# Every namespace new. Inside, the seccomp filter (`seccomp`) lets no process make a user namespace
# again, so none can make a PID, mount or network namespace either (each needs capabilities only a new user
# namespace gives).
_NAMESPACES = ("--unshare-all", "--unshare-user")


def _seccomp_fd() -> int:
    """A pipe's read end holding the seccomp program, for `--seccomp FD` (the caller closes it)."""
    program = filter_program()
    if program is None:
        raise SandboxUnavailable(f"The sandbox has no seccomp filter for this machine ({platform.machine()}).")
    read, write = os.pipe()
    os.write(write, program)  # a few hundred bytes: within any pipe's buffer
    os.close(write)
    return read


def run_sandboxed(
    source: str,
    *,
    url: str = "",
    origins: Sequence[str] | None = None,
    browser: str,
    timeout_s: float,
    default_timeout_ms: float | None = None,
    argv: Sequence[str] = (),
    memory_bytes: int = MEMORY_BYTES,
    binds: Sequence[Bind] = (),
    init_hooks: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run `source` in the sandbox; see the module docstring.

    Network: the origins `origins` (http(s)://host[:port]) and nothing else; without `origins`, `url`'s
    origin (a file:// `url` is bound read-only, alone, and no network is given). `argv` follows the
    script's name in its sys.argv. `default_timeout_ms` lowers Playwright's default waits (None: leave
    them). `memory_bytes` is the memory of the whole run, shared memory and its tmpfs folders included.
    `binds` and `init_hooks` (Python files run inside before the script, as `init_in_sandbox` runs its own
    set-up) are for features built on top. `env` adds variables (a replayed script's secrets).

    Raises SandboxUnavailable when bubblewrap is missing or cannot start, or an origin cannot be reached
    from inside (a non-loopback IP address)."""
    problem = bubblewrap_problem()
    if problem:
        raise SandboxUnavailable(problem)
    page_file = ""
    if origins is None:
        origins = []
        target = urlsplit(url)
        if target.scheme in ("http", "https"):
            origins = [url]
        elif target.scheme == "file" and Path(target.path).is_file():
            page_file = target.path
    targets = [urlsplit(o) for o in dict.fromkeys(origins)]
    work_dir = Path(tempfile.mkdtemp(prefix="qvl-sandbox-"))
    forwarder: Forwarder | None = None
    try:
        (work_dir / "script.py").write_text(source, encoding="utf-8")
        extra: list[str] = []
        relays = []
        if targets:
            listens, hosts = inside_addresses(targets)
            (work_dir / "hosts").write_text(hosts, encoding="utf-8")
            extra += ["--ro-bind", str(work_dir / "hosts"), "/etc/hosts"]
            forwarder = Forwarder(work_dir, targets)
            for n, (target, listen, path) in enumerate(zip(targets, listens, forwarder.paths, strict=True)):
                extra += ["--ro-bind", str(path), f"/sandbox/net{n}.sock"]
                relays.append([listen, port_of(target), f"/sandbox/net{n}.sock"])
        if page_file:
            extra += ["--ro-bind", page_file, page_file]
        for bind in binds:
            extra += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
        hooks = []
        for n, hook in enumerate(init_hooks):
            hooks.append(f"/sandbox/hook{n}.py")
            extra += ["--ro-bind", str(hook), hooks[-1]]
        low_ports = any(port < 1024 for _, port, _ in relays)
        files_read, files_write = os.pipe()  # the init sends the scratch folder's files back through it
        spec = {
            "relays": relays,
            "timeout_ms": default_timeout_ms,
            "limits": [min(memory_bytes, MEMORY_BYTES), PROCESSES, FILE_BYTES],
            "hooks": hooks,
            "script": SCRIPT_INSIDE,
            "argv": list(argv),
            "files_fd": files_write,
            "copy_bytes": COPY_BYTES,
        }
        # The writable folders: tmpfs sized in bytes, and in entries too where we can mount them (`launch`).
        tmpfs: dict[Path, int] = {}  # host folder -> bytes, mounted before bubblewrap starts
        tmpfs_args: list[str] = []
        for inside, size in (("/tmp", TMPFS_BYTES), ("/dev/shm", TMPFS_BYTES), ("/scratch", SCRATCH_BYTES)):
            if can_size_entries():
                folder = work_dir / ("mount-" + inside.rsplit("/", 1)[1])
                folder.mkdir()
                tmpfs[folder] = size
                tmpfs_args += ["--bind", str(folder), inside]
            else:
                tmpfs_args += ["--size", str(size), "--tmpfs", inside]
        command = [
            shutil.which("bwrap") or "bwrap",
            *_system_binds(),
            *_NAMESPACES,
            "--uid",
            "0",
            "--gid",
            "0",
            "--cap-drop",
            "ALL",
            *(["--cap-add", "CAP_NET_BIND_SERVICE"] if low_ports else []),
            "--die-with-parent",
            "--new-session",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            *tmpfs_args,
            # After the tmpfs mounts, which would otherwise hide a Python, browser or page under /tmp.
            *_python_and_browser_binds(browser),
            *extra,
            "--ro-bind",
            str(work_dir / "script.py"),
            SCRIPT_INSIDE,
            "--ro-bind",
            str(INIT),
            INIT_INSIDE,
            # Set-up done: the root (bubblewrap's own tmpfs, which no --size reaches) and /dev become
            # read-only; only the sized tmpfs folders above stay writable.
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--chdir",
            "/scratch",
            "--",
            sys.executable,
            "-I",
            INIT_INSIDE,
            json.dumps(spec),
        ]
        env = {
            **(env or {}),  # first: none of them can replace the six below
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "QVL_BROWSER": browser,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        log_path = work_dir / "output.log"
        info_read, info_write = os.pipe()  # bubblewrap writes {"child-pid": N} here: the namespace's first process
        seccomp = _seccomp_fd()
        command[1:1] = ["--info-fd", str(info_write), "--seccomp", str(seccomp)]
        receiver = FileReceiver(files_read, COPY_BYTES)
        # The kernel's limits where a cgroup can be made: bubblewrap is born in it (`launch`).
        group = Cgroup.make(memory_bytes, PROCESSES)
        started = time.monotonic()
        try:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [*launcher(group.procs_files() if group else [], tmpfs), *command], env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                    pass_fds=(info_write, files_write, seccomp),
                )  # fmt: skip
        except BaseException:
            if group is not None:
                group.remove()
            raise
        finally:
            for fd in (info_write, files_write, seccomp):
                os.close(fd)
        receiver.start()
        watchdog = Watchdog(
            proc, info_read, memory_bytes=memory_bytes, count_files=not tmpfs,
            killed_for_memory=group.killed_for_memory if group is not None else None,
        )  # fmt: skip
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
        limit = watchdog.reason
        if group is not None:
            if not limit and group.killed_for_memory():
                limit = memory_limit_reason(memory_bytes)
            if limit:
                with contextlib.suppress(ProcessLookupError):  # whatever is left goes with bubblewrap
                    os.killpg(proc.pid, signal.SIGKILL)
        if returncode is None or limit:
            _wait_for_namespace_end(watchdog.child_pid)
        if group is not None:
            group.remove()
        files = receiver.result(wait_s=10)
        seconds = time.monotonic() - started
        return SandboxResult(returncode, read_tail(log_path), files, seconds, limit)
    finally:
        if forwarder is not None:
            forwarder.stop()
        remove_tree(work_dir)


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
    # The environment's package folders, and those a .pth file adds (a venv that borrows its parent's).
    packages = [sysconfig.get_path(name) for name in ("purelib", "platlib")]
    packages += [entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")]
    wanted = {Path(sys.base_prefix), Path(sys.prefix), *(Path(folder).resolve() for folder in packages)}
    resolved = Path(browser).resolve()
    wanted.add(resolved.parent)
    binds: list[str] = []
    for path in sorted(wanted):
        if not path.is_relative_to("/usr") and path.exists():
            binds += ["--ro-bind", str(path), str(path)]
    if Path(browser) != resolved and not Path(browser).is_relative_to("/usr"):
        binds += ["--ro-bind", browser, browser]
    return binds


def read_tail(path: Path) -> str:
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - OUTPUT_TAIL_BYTES))
        return f.read().decode("utf-8", "replace")
