"""Hostile scripts against the verification sandbox, the policy lint bypassed: each asserts that its effect
did NOT happen (a canary file unchanged and unread, a listener on another loopback port that received
nothing, no process outliving the run, the parent's memory bounded). Legitimate scripts against pages
served on 127.0.0.1 still verify: the target's own port must be reachable while its neighbours are not."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from qvl_agent.errors import SandboxUnavailable
from qvl_agent.playwright.chromium import find_browser
from qvl_agent.sandbox import bubblewrap, files_out
from qvl_agent.sandbox.launch import can_size_entries
from qvl_agent.scripts.write.writer import keep_files, verify_script
from tests.pages.server import PageServer

pytestmark = pytest.mark.browser

BROWSER = find_browser()
HEADER = "import os, sys, socket, subprocess\nfrom playwright.sync_api import sync_playwright, expect\n"
LAUNCH = 'with sync_playwright() as p:\n    b = p.chromium.launch(executable_path=os.environ["QVL_BROWSER"])\n'


class Listener:
    """A TCP service on another loopback port (IPv4 and IPv6) and an abstract unix socket: records every
    connection and every byte it gets."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.v4 = socket.create_server(("127.0.0.1", 0))
        self.port = self.v4.getsockname()[1]
        self.v6 = socket.create_server(("::1", self.port), family=socket.AF_INET6)
        self.abstract_name = f"qvl-test-{uuid.uuid4().hex}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.abstract_name)
        self.unix.listen()
        for s in (self.v4, self.v6, self.unix):
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.received.append(b"<connected>" + conn.recv(65536))
            except OSError:
                self.received.append(b"<connected>")
            conn.close()

    def close(self) -> None:
        for s in (self.v4, self.v6, self.unix):
            s.close()


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def listener():
    srv = Listener()
    yield srv
    srv.close()


@pytest.fixture
def canary(tmp_path):
    path = tmp_path / "canary.txt"
    path.write_text("canary-" + uuid.uuid4().hex)
    return path


def run(source: str, server: PageServer, timeout_s: float = 60, **options):
    return bubblewrap.run_sandboxed(
        source, url=server.url + "/login.html", browser=BROWSER, timeout_s=timeout_s, default_timeout_ms=5000,
        **options,
    )  # fmt: skip


def test_bubblewrap_is_available_here():
    assert bubblewrap.bubblewrap_problem() is None


# --- files --------------------------------------------------------------------------------------------


def test_files_outside_the_scratch_folder_are_neither_read_nor_written(server, canary, tmp_path):
    secret = canary.read_text()
    host_tmp_marker = Path("/tmp") / f"qvl-hostile-{uuid.uuid4().hex}"
    script = HEADER + (
        f"for path in [{str(canary)!r}, '/etc/shadow', '/root/.bashrc', '/proc/1/environ']:\n"
        "    try:\n"
        "        print(path, open(path).read())\n"
        "    except OSError as exc:\n"
        "        print(path, 'unreadable', type(exc).__name__)\n"
        f"for path in [{str(canary)!r}, {str(tmp_path / 'new.txt')!r}, {str(host_tmp_marker)!r}, '/usr/pwned']:\n"
        "    try:\n"
        "        open(path, 'w').write('pwned')\n"
        "    except OSError as exc:\n"
        "        print(path, 'unwritable', type(exc).__name__)\n"
        "print('ssl-private', os.path.exists('/etc/ssl/private'))\n"  # root-only host keys
        "print(sorted(os.listdir('/')))\n"
    )
    result = run(script, server)
    assert "ssl-private False" in result.output, result.output
    assert secret not in result.output
    assert canary.read_text() == secret
    assert not (tmp_path / "new.txt").exists()
    assert not host_tmp_marker.exists()
    assert not Path("/usr/pwned").exists()
    assert "home" not in result.output.split("[")[-1]  # no home folder in the sandbox's root


def test_the_browser_cannot_open_local_files_either(server, canary):
    script = (
        HEADER
        + LAUNCH
        + (
            "    page = b.new_page()\n"
            f"    for url in ['file://{canary}', 'file:///root/', 'file:///etc/passwd']:\n"
            "        try:\n"
            "            page.goto(url)\n"
            "            print(url, page.content())\n"
            "        except Exception as exc:\n"
            "            print(url, 'unreachable')\n"
            "    b.close()\n"
        )
    )
    result = run(script, server)
    assert result.returncode == 0, result.output
    assert canary.read_text() not in result.output and "root:x:0:0" not in result.output


def test_records_a_script_writes_into_the_copy_back_pipe_itself_are_capped(server, tmp_path):
    """The script runs in the process that holds the copy-back pipe: it finds the pipe and writes 30,000
    records of its own. No more files than the scratch folder may hold come out, and none lands beside
    the person's files."""
    script = HEADER + (
        "import stat\n"
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        if not stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "            continue\n"
        "        for n in range(30000):\n"
        "            name = f'forged{n}.txt'.encode()\n"
        "            os.write(fd, b'F' + len(name).to_bytes(4, 'big') + name + (1).to_bytes(8, 'big') + b'x')\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = run(script, server)
    assert 0 < len(result.files) <= files_out.MAX_FILES  # the forged records arrived, and were capped
    kept = keep_files(result.files, tmp_path / "out", numbered=False)
    assert len(kept.written) <= files_out.MAX_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_files_written_with_hidden_or_existing_names_are_not_copied_over_the_persons_files(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    (home / "old.png").write_bytes(b"old")
    files = {".bashrc": b"evil", ".config/autostart/x.desktop": b"evil", "notes.txt": b"evil", "old.png": b"new",
             "shots/new.png": b"png", "data/report.csv": b"a,b", ".git/config": b"evil",
             ".ssh/authorized_keys": b"evil", "AGENTS.md": b"evil", "CLAUDE.md": b"evil", "requirements.txt": b"evil",
             "sub/AGENTS.md": b"evil", "/etc/abs.png": b"evil", "../up.png": b"evil",
             "a/../../up2.png": b"evil"}  # fmt: skip
    # Files that something runs by itself, as a page could serve them for download.save_as(...)
    runnable = ["conftest.py", "Makefile", "setup.py", "run.sh", "x.desktop", "package.json", "lib/evil.pth",
                "tool.exe", "Dockerfile"]  # fmt: skip
    kept = keep_files({**files, **dict.fromkeys(runnable, b"evil")}, home / "script.verified")
    assert kept.folder == home / "script.verified"
    assert sorted(p.relative_to(kept.folder).as_posix() for p in kept.written) == [
        "data/report.csv", "notes.txt", "old.png", "shots/new.png"
    ]  # fmt: skip
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "old.png", "script.verified"]
    assert (home / "notes.txt").read_text() == "mine" and (home / "old.png").read_bytes() == b"old"
    assert not (tmp_path / "up.png").exists() and not (tmp_path / "up2.png").exists()
    assert not Path("/etc/abs.png").exists()
    # a second run never writes into the first one's folder
    again = keep_files({"old.png": b"newer"}, home / "script.verified")
    assert again.folder == home / "script.verified-2" and (kept.folder / "old.png").read_bytes() == b"new"


def test_files_are_not_kept_through_a_link_to_a_folder_elsewhere(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "script.verified").symlink_to(elsewhere)  # a link where the new folder would go
    kept = keep_files({"www/index.txt": b"evil", "shot.png": b"png"}, home / "script.verified")
    assert kept.folder == home / "script.verified-2"
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_in_the_scratch_folder_does_not_carry_a_file_out(server, canary):
    script = HEADER + f"os.symlink({str(canary)!r}, 'shot.png')\nos.symlink('/etc/hostname', 'host.txt')\n"
    result = run(script, server)
    assert result.returncode == 0, result.output
    assert "shot.png" not in result.files and "host.txt" not in result.files
    assert all(canary.read_text().encode() not in data for data in result.files.values())


def test_shell_commands_run_only_inside_and_leave_nothing_outside(server, tmp_path):
    marker = tmp_path / "command-ran"
    script = HEADER + (
        f"os.system('touch {marker}')\n"
        f"subprocess.run(['sh', '-c', 'echo pwned > {marker}'])\n"
        "print(subprocess.run(['id'], capture_output=True, text=True).stdout)\n"
    )
    run(script, server)
    assert not marker.exists()


def test_chromium_flags_that_run_programs_stay_inside(server, tmp_path):
    marker = tmp_path / "flag-ran"
    script = HEADER + (
        "with sync_playwright() as p:\n"
        "    b = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'], "
        f"args=['--renderer-cmd-prefix=sh -c \"touch {marker}\"', '--utility-cmd-prefix=touch {marker}'])\n"
        "    page = b.new_page()\n"
        "    try:\n"
        "        page.goto(os.environ.get('URL', 'about:blank'))\n"
        "    except Exception as exc:\n"
        "        print(exc)\n"
        "    b.close()\n"
    )
    # A renderer that cannot start leaves the page hanging: 20 s is long past any renderer's launch.
    run(script, server, timeout_s=20)
    assert not marker.exists()


def test_the_parent_environment_does_not_leak_in(server, monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("QVL_SECRET_API_KEY", secret)
    script = HEADER + (
        "print(dict(os.environ))\n"
        "import glob\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = run(script, server)
    assert result.returncode == 0, result.output
    assert secret not in result.output and "QVL_BROWSER" in result.output


# --- network ------------------------------------------------------------------------------------------


def test_raw_sockets_reach_no_other_loopback_port_no_abstract_socket_and_no_outside_host(server, listener):
    script = HEADER + (
        f"for family, address in [(socket.AF_INET, ('127.0.0.1', {listener.port})), "
        f"(socket.AF_INET6, ('::1', {listener.port})), (socket.AF_UNIX, '\\0{listener.abstract_name}'), "
        "(socket.AF_INET, ('1.1.1.1', 80)), (socket.AF_INET, ('169.254.169.254', 80))]:\n"
        "    s = socket.socket(family, socket.SOCK_STREAM)\n"
        "    s.settimeout(3)\n"
        "    try:\n"
        "        s.connect(address)\n"
        "        s.sendall(b'LEAK')\n"
        "        print('connected', address)\n"
        "    except OSError as exc:\n"
        "        print('refused', address, exc)\n"
        f"socket.create_connection(('127.0.0.1', {server.port})).close()\n"  # the target itself is reachable
        "print('target reachable')\n"
    )
    result = run(script, server)
    assert listener.received == []
    assert "target reachable" in result.output, result.output
    assert "connected" not in result.output


def test_the_browser_reaches_the_target_but_no_other_port_proxy_or_api_client(server, listener):
    other = f"http://127.0.0.1:{listener.port}"
    script = HEADER + (
        "with sync_playwright() as p:\n"
        f"    b = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'], proxy={{'server': {other!r}}})\n"
        "    page = b.new_page()\n"
        "    for url in [" + f"{other + '/goto'!r}, 'http://localhost:{listener.port}/', 'http://example.com/'" + "]:\n"
        "        try:\n"
        "            page.goto(url, timeout=3000)\n"
        "        except Exception as exc:\n"
        "            print('blocked', url)\n"
        "    b.close()\n"
        "    b = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'])\n"
        "    page = b.new_page()\n"
        f"    page.goto({server.url + '/login.html'!r})\n"
        f"    print(page.evaluate(\"fetch('{other}/fetch').then(() => 'ok', () => 'fetch blocked')\"))\n"
        "    try:\n"
        f"        page.request.get({other + '/api'!r}, timeout=3000)\n"
        "    except Exception:\n"
        "        print('api blocked')\n"
        "    expect(page.get_by_role('heading')).to_have_text('Sign in to Acme')\n"
        "    print('target reached')\n"
        "    b.close()\n"
    )
    result = run(script, server)
    assert listener.received == []
    assert "target reached" in result.output, result.output
    assert "fetch blocked" in result.output and "api blocked" in result.output


# --- processes and resources --------------------------------------------------------------------------


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_no_process_outlives_the_timeout(server):
    token = "qvl-hostile-" + uuid.uuid4().hex
    script = HEADER + (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {token!r}], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', {token!r}])\n"
        "    os._exit(0)\n"
        "with sync_playwright() as p:\n"
        "    b = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'])\n"
        "    print('waiting', flush=True)\n"
        "    time.sleep(600)\n"
    )
    result = run(script, server, timeout_s=8)
    assert result.returncode is None  # the timeout ended it
    assert "waiting" in result.output
    assert _processes_with(token) == []


def test_a_process_of_the_host_cannot_be_signalled(server):
    victim = subprocess.Popen(["sleep", "120"])
    try:
        script = (
            HEADER
            + f"import signal\ntry:\n    os.kill({victim.pid}, signal.SIGKILL)\nexcept OSError as e:\n    print(e)\n"
        )
        run(script, server)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def _peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_endless_output_and_a_memory_blow_up_leave_the_parent_bounded(server):
    before = _peak_rss_kib()
    flood = run(HEADER + "chunk = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(chunk)\n", server)
    hog = run(HEADER + "blocks = []\nwhile True:\n    blocks.append(bytearray(256 << 20))\n", server)
    assert _peak_rss_kib() - before < 64 * 1024  # the parent read back only the output's tail
    assert flood.returncode != 0 and len(flood.output) <= bubblewrap.OUTPUT_TAIL_BYTES
    assert hog.returncode != 0 and "MemoryError" in hog.output


def test_a_fork_bomb_is_stopped_even_when_run_as_root(server):
    # RLIMIT_NPROC does not hold for root (this test machine and CI run as root): the watchdog must.
    token = "qvl-hostile-" + uuid.uuid4().hex
    script = HEADER + (
        "import time\n"
        "for n in range(4000):\n"
        "    if os.fork() == 0:\n"
        f"        sys.argv[0] = {token!r}\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "print('forked all', flush=True)\n"
        "time.sleep(60)\n"
    )
    result = verify_script(script, server.url + "/login.html", BROWSER, 60)
    assert not result.ok
    # stopped by the watchdog: for too many processes, or for the memory those thousands hold together
    assert "it was stopped because it" in result.error and "forked all" not in result.error
    assert _processes_with(token) == []


def test_processes_that_each_stay_under_the_memory_limit_are_stopped_together(server):
    # Each process has its own RLIMIT_DATA; together they could take the machine's memory. The limit is
    # lowered here so that the test itself stays light: 3 processes of 200 MB against 512 MB in all. Once
    # one of them is stopped for memory the whole run ends: the two left (400 MB, under the limit) never
    # get to speak.
    token = "qvl-hostile-" + uuid.uuid4().hex
    script = HEADER + (
        "import time\n"
        "for n in range(3):\n"
        "    if os.fork() == 0:\n"
        f"        sys.argv[0] = {token!r}\n"
        "        block = b'x' * (200 << 20)\n"
        "        time.sleep(20)\n"
        "        print('a child outlived the wall', flush=True)\n"
        "        os._exit(0)\n"
        "time.sleep(20)\n"
        "print('the run outlived the wall', flush=True)\n"
    )
    result = run(script, server, memory_bytes=512 << 20)
    assert "of memory together" in result.limit and result.returncode != 0
    assert "outlived the wall" not in result.output
    assert _processes_with(token) == []


def test_filling_the_disk_is_stopped_at_the_scratch_folders_size(server):
    # The scratch folder is a sized tmpfs: the kernel refuses the bytes past its size, whatever the file
    # count or whether the files are still named. Each script lingers after the attempt, so only the
    # kernel's refusal (or the watchdog) can have stopped it.
    linger = "import time\nprint('all written', flush=True)\ntime.sleep(40)\n"
    files = run(HEADER + "for n in range(40):\n    open(f'f{n}.bin', 'wb').write(b'x' * (16 << 20))\n" + linger, server)
    unlinked = run(HEADER + (
        "held = []\n"
        "for n in range(40):\n"
        "    f = open(f'u{n}.bin', 'wb')\n"
        "    os.unlink(f'u{n}.bin')\n"
        "    f.write(b'x' * (16 << 20))\n"
        "    f.flush()\n"
        "    held.append(f)\n"
    ) + linger, server, timeout_s=20)  # fmt: skip
    entries = run(HEADER + "for n in range(30000):\n    open(f'e{n}', 'w').close()\n" + linger, server)
    assert files.returncode != 0 and "No space left on device" in files.output and "all written" not in files.output
    assert unlinked.returncode != 0 and "No space left on device" in unlinked.output
    assert "all written" not in unlinked.output
    # Files: the kernel refuses the one past the limit where the folders are sized in entries (as root),
    # else the watchdog ends the run; either way the script never gets to say it made them all.
    refused = (
        "No space left on device" in entries.output if can_size_entries() else "files and folders" in entries.limit
    )
    assert entries.returncode != 0 and refused and "all written" not in entries.output
    assert sum(len(data) for data in files.files.values()) <= bubblewrap.COPY_BYTES


def test_files_in_the_sandboxs_root_and_dev_cannot_be_written(server):
    script = HEADER + (
        "for path in ['/etc/fill', '/fill', '/sandbox/fill', '/dev/fill', '/usr/fill']:\n"
        "    try:\n"
        "        open(path, 'wb').write(b'x' * (1 << 20))\n"
        "        print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, exc.errno)\n"
    )
    result = run(script, server)
    assert result.returncode == 0, result.output
    assert "wrote" not in result.output and result.output.count("refused") == 5


def test_no_nested_user_namespace_can_be_made(server):
    script = HEADER + (
        "import ctypes\n"
        "r = subprocess.run(['unshare', '-U', '-p', '-f', 'true'], capture_output=True, text=True)\n"
        "print('unshare exit', r.returncode)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('raw unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
        "try:\n"
        "    os.unshare(os.CLONE_NEWUSER)\n"
        "    print('NESTED USERNS MADE')\n"
        "except (OSError, AttributeError) as exc:\n"
        "    print('refused', exc)\n"
    )
    result = run(script, server)
    assert "unshare exit 0" not in result.output and "unshare exit" in result.output
    assert "raw unshare -1 1" in result.output  # EPERM
    assert "NESTED USERNS MADE" not in result.output


def test_system_v_shared_memory_that_no_process_holds_cannot_be_made(server):
    script = HEADER + (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('shmget', libc.shmget(0, 256 << 20, 0o1600), ctypes.get_errno())\n"  # IPC_PRIVATE | IPC_CREAT
        "print('msgget', libc.msgget(0, 0o1600), ctypes.get_errno())\n"
    )
    result = run(script, server)
    assert "shmget -1 1" in result.output and "msgget -1 1" in result.output, result.output


def test_shared_memory_counts_against_the_memory_limit(server):
    # memfd + a shared mapping: neither heap (RLIMIT_DATA) nor private memory. Each memfd stays under the
    # file size limit; 16 of them together would hold 1 GB against a limit of 512 MB.
    token = "qvl-hostile-" + uuid.uuid4().hex
    script = HEADER + (
        "import mmap, time\n"
        f"sys.argv[0] = {token!r}\n"
        "maps = []\n"
        "for n in range(16):\n"
        "    fd = os.memfd_create(f'm{n}')\n"
        "    os.ftruncate(fd, 64 << 20)\n"
        "    m = mmap.mmap(fd, 64 << 20, mmap.MAP_SHARED)\n"
        "    for i in range(0, 64 << 20, 4096):\n"
        "        m[i] = 1\n"
        "    maps.append(m)\n"
        "print('held it all', flush=True)\n"
        "time.sleep(60)\n"
    )
    result = run(script, server, memory_bytes=512 << 20)
    assert "of memory together" in result.limit and result.returncode != 0
    assert "held it all" not in result.output
    assert _processes_with(token) == []


def test_memfds_held_open_but_unmapped_count_too(server):
    script = HEADER + (
        "import time\n"
        "fds = []\n"
        "for n in range(16):\n"
        "    fd = os.memfd_create(f'm{n}')\n"
        "    os.write(fd, b'x' * (60 << 20))\n"
        "    fds.append(fd)\n"
        "print('held it all', flush=True)\n"
        "time.sleep(60)\n"
    )
    result = run(script, server, memory_bytes=512 << 20)
    assert "of memory together" in result.limit and "held it all" not in result.output


def test_threads_of_child_processes_are_counted(server):
    # Without a new user namespace no PID namespace can be made either (above); the threads of a child
    # process are counted with the rest. Small stacks, so that RLIMIT_DATA does not stop them first.
    script = HEADER + (
        "import threading, time\n"
        "threading.stack_size(65536)\n"
        "if os.fork() == 0:\n"
        "    started = 0\n"
        "    try:\n"
        "        for n in range(1500):\n"
        "            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "            started += 1\n"
        "    except RuntimeError:\n"
        "        pass\n"
        "    print('started', started, flush=True)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    result = run(script, server, timeout_s=40)
    # Either the kernel refused the 1025th task (the run's cgroup) or the watchdog ended the run.
    started = re.search(r"started (\d+)", result.output)
    assert "processes and threads" in result.limit or (started and int(started[1]) < bubblewrap.PROCESSES)


def test_folders_nested_past_any_path_length_are_cleaned_up(server, tmp_path, monkeypatch):
    # 3000 levels: past PATH_MAX and Python's recursion limit, both of which the parent's own file handling
    # (collecting the files, deleting its work folder) must survive.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the sandbox's work folder goes
    nest = "for n in range({}):\n    os.mkdir('d')\n    os.chdir('d')\nopen('deep.png', 'wb').write(b'png')\n"
    deep = run(HEADER + nest.format(3000), server)
    assert deep.returncode == 0, deep.output
    assert not any(name.endswith("deep.png") for name in deep.files)  # deeper than what is sent back
    assert list(tmp_path.iterdir()) == []  # the work folder removed


# --- legitimate scripts still verify ------------------------------------------------------------------

LOGIN = (
    HEADER
    + LAUNCH
    + (
        "    page = b.new_page()\n"
        "    page.goto('{url}/login.html')\n"
        "    page.get_by_label('Username').fill('grace')\n"
        "    page.get_by_label('Password').fill('hopper')\n"
        "    page.get_by_role('button', name='{button}').click()\n"
        "    expect(page.get_by_role('heading')).to_have_text('Welcome, grace')\n"
        "    page.screenshot(path='shots/welcome.png')\n"
        "    page.pdf(path='welcome.pdf')\n"
        '    page.set_content(\'<a download="report.txt" href="data:text/plain,quarterly">Get</a>\')\n'
        "    with page.expect_download() as info:\n"
        "        page.get_by_text('Get').click()\n"
        "    info.value.save_as('downloads/report.txt')\n"
        "    b.close()\n"
    )
)


def test_a_legitimate_script_fills_a_form_and_its_files_come_back(server):
    server.clear()
    result = verify_script(LOGIN.format(url=server.url, button="Sign in"), server.url + "/login.html", BROWSER, 60)
    assert result.ok, result.error
    assert server.records("login") == [{"username": "grace", "password": "hopper"}]
    assert result.files["shots/welcome.png"].startswith(b"\x89PNG")
    assert result.files["welcome.pdf"].startswith(b"%PDF")
    assert result.files["downloads/report.txt"] == b"quarterly"


def test_a_script_that_asks_for_a_visible_browser_runs_headless_and_says_so(server):
    # Most people's own scripts launch with headless=False; there is no display in the sandbox.
    headed = LOGIN.format(url=server.url, button="Sign in").replace("launch(", "launch(headless=False, ", 1)
    assert "headless=False" in headed
    server.clear()
    result = run(headed, server)
    assert result.returncode == 0, result.output
    assert "the script asked for a visible browser; in the sandbox it runs headless." in result.output
    assert server.records("login") == [{"username": "grace", "password": "hopper"}]


def test_a_wrong_locator_fails_with_playwrights_message_before_a_short_timeout(server):
    result = verify_script(LOGIN.format(url=server.url, button="Log in"), server.url + "/login.html", BROWSER, 12)
    assert not result.ok
    assert "did not finish" not in result.error
    assert "Log in" in result.error and "Timeout" in result.error  # the locator Playwright waited for
    assert "/sandbox/init.py" not in result.error and "runpy" not in result.error


def test_the_sandbox_runs_as_a_separate_python(server):
    # Sanity for the rest: the interpreter inside is this one, so the scripts above ran what they say.
    result = run(HEADER + "print(sys.version)\n", server)
    assert result.returncode == 0 and sys.version.split()[0] in result.output


def test_a_python_installed_under_tmp_runs_inside_and_the_rest_of_tmp_stays_hidden(server, canary, tmp_path):
    # The sandbox mounts its own /tmp; a person's Python environment under the host's /tmp must still be
    # visible inside (bound after that mount), and nothing else of the host's /tmp with it.
    import site

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = next(venv.glob("lib/python*/site-packages"))
    (packages / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    inside = (
        "import sys\nprint(sys.prefix)\n"
        f"try:\n    print(open({str(canary)!r}).read())\n"
        "except OSError as exc:\n    print('unreadable', type(exc).__name__)\n"
    )
    runner = (
        "import json, sys\n"
        "from qvl_agent.sandbox import bubblewrap\n"
        "url, browser, source = sys.argv[1:]\n"
        "r = bubblewrap.run_sandboxed(source, url=url, browser=browser, timeout_s=60, default_timeout_ms=5000)\n"
        "print(json.dumps([r.returncode, r.output]))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", runner, server.url + "/login.html", BROWSER, inside],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    returncode, output = json.loads(done.stdout.splitlines()[-1])
    assert returncode == 0, output
    assert str(venv) in output  # the interpreter inside is the one under /tmp
    assert canary.read_text() not in output and "unreadable" in output


# --- memory the kernel counts (Safety IV): each class ends the run before it holds 1.25 x the limit -------

LIMIT_MB = 256
HOLD = (
    "import mmap, socket\n"
    "a, b = socket.socketpair()\n"
    "held = []\n"
    "def fill(fd, mb):\n"
    "    os.ftruncate(fd, mb << 20)\n"
    "    m = mmap.mmap(fd, mb << 20)\n"
    "    for at in range(0, mb << 20, 4096):\n"
    "        m[at] = 1\n"
    "    return m\n"
)
MEMORY_HOGS = {
    # A memfd mapped, filled, then unmapped and closed: the pages live on in the page cache of nobody's file.
    "memfd-closed": "for n in range(64):\n    fd = os.memfd_create('m')\n    held.append(fill(fd, 16))\n"
    "    os.close(fd)\n    print('held', (n + 1) * 16, flush=True)\n",
    # Memfds parked in a unix socket (SCM_RIGHTS): no process holds a descriptor or a mapping.
    "memfd-in-flight": "for n in range(64):\n    fd = os.memfd_create('m')\n    fill(fd, 16).close()\n"
    "    socket.send_fds(a, [b'x'], [fd])\n    os.close(fd)\n    print('held', (n + 1) * 16, flush=True)\n",
    # Data queued in socket buffers: kernel memory, in no process at all.
    "socket-buffers": "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))\n"
    "for n in range(3000):\n    x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "    x.setblocking(False)\n    try:\n        while True:\n            x.send(b'y' * 60000)\n"
    "    except (BlockingIOError, OSError):\n        pass\n    held.append((x, y))\n"
    "    if n % 50 == 49:\n        print('held', (n + 1) * 200 // 1000, flush=True)\n",
}


@pytest.mark.parametrize("hog", MEMORY_HOGS)
def test_memory_no_process_holds_is_stopped_at_the_limit(server, hog):
    """Memory the watchdog cannot see in any process is charged by the kernel to the run's cgroup: the run
    ends for memory, and what it reported holding never passed the limit by more than a quarter."""
    script = HEADER + HOLD + MEMORY_HOGS[hog] + "print('held it all', flush=True)\nimport time\ntime.sleep(30)\n"
    result = run(script, server, timeout_s=25, memory_bytes=LIMIT_MB << 20)
    assert "held it all" not in result.output
    held = [int(n) for n in re.findall(r"^held (\d+)$", result.output, re.M)]
    assert max(held, default=0) <= LIMIT_MB * 1.25, result.output[-500:]
    assert "of memory together" in result.limit, (result.limit, result.output[-500:])


def test_many_connections_and_origins_cost_the_host_no_thread_each(server):
    """300 connections held open through the forwarder: this process gains no thread per connection, the
    sandbox gets at most `net.MAX_CONNECTIONS` of them at once, and a script may name at most
    `net.MAX_ORIGINS` origins."""
    from qvl_agent.sandbox import net

    script = HEADER + (
        "import time\n"
        f"port = {int(server.url.rsplit(':', 1)[1])}\n"
        "held = []\n"
        "for n in range(300):\n"
        "    try:\n"
        "        s = socket.create_connection(('127.0.0.1', port), timeout=2)\n"
        "        s.sendall(b'GET /login.html HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "        held.append(s)\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(3)\n"
        # A busy machine may answer late: wait for the answers up to 30 s in all, not 2 s a connection.
        "answered, deadline = 0, time.monotonic() + 30\n"
        "for s in held:\n"
        "    s.settimeout(max(0.1, deadline - time.monotonic()))\n"
        "    try:\n"
        "        answered += s.recv(12).startswith(b'HTTP/1')\n"
        "    except OSError:\n"
        "        pass\n"
        "print('answered', answered, flush=True)\n"
    )
    most = [0]
    done = threading.Event()
    own = ("qvl-sandbox", "(_relay)", "(pipe)")  # the forwarder's names, and its old thread-per-connection's

    def sample():
        while not done.wait(0.05):
            mine = [t for t in threading.enumerate() if any(name in t.name for name in own)]
            most[0] = max(most[0], len(mine))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run(script, server, timeout_s=60)
    finally:
        done.set()
        sampler.join()
    said = re.search(r"answered (\d+)", result.output)
    assert said, result.output[-2000:]
    assert 0 < int(said[1]) <= net.MAX_CONNECTIONS, result.output[-300:]
    assert 0 < most[0] <= 3  # the watchdog, the files reader, the forwarder: not two per connection
    origins = [f"http://127.0.0.{n}:{8000 + n}" for n in range(1, net.MAX_ORIGINS + 2)]
    with pytest.raises(SandboxUnavailable, match=f"at most {net.MAX_ORIGINS} origins"):
        bubblewrap.run_sandboxed("print(1)", origins=origins, browser=BROWSER, timeout_s=10)


def test_tens_of_thousands_of_descriptors_end_the_run_instead_of_stalling_the_watch(server):
    """Each poll reads every descriptor of the sandbox: a script holding 30,000 is stopped at the watch's
    limit, not left unwatched while one poll crawls through them."""
    script = HEADER + (
        "import resource, time\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n"
        "per = max(1, min(hard - 64, 30000) // 2)\n"  # pipes per process: as many as its limit allows
        "for child in range(-(-15000 // per)):\n"
        "    if os.fork() == 0:\n"
        "        held = [os.pipe() for n in range(per)]\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "print('forked them all', flush=True)\n"
        "time.sleep(30)\n"
    )
    result = run(script, server, timeout_s=25)
    assert result.returncode is not None, "the watch never stopped it: the timeout did"
    assert "open files and sockets" in result.limit, (result.limit, result.output[-300:])
