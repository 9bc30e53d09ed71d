"""Limits of a running verification sandbox that no resource limit of the kernel enforces, checked from outside.

`Watchdog` polls the sandbox while it runs and ends it (with the reason) when it holds more than
`TASKS` processes and threads or `MEMORY_BYTES` of memory in all, or its scratch folder more than
`SCRATCH_BYTES` or `SCRATCH_ENTRIES`:

- **Processes:** RLIMIT_NPROC, set inside, does not hold when qvl-agent runs as root: the kernel exempts
  the global root user, and the sandbox's root is the host's root then. A fork bomb would fill the
  machine's memory and process table before the timeout. Here every task of the sandbox's PID namespace
  is counted, whoever runs it.
- **Memory:** RLIMIT_DATA caps each process, so a few processes together could still take the machine's
  memory (and the out-of-memory killer might pick the model's process instead). The resident memory of
  all the namespace's processes is summed.
- **Disk:** RLIMIT_FSIZE caps one file, not how many: the scratch folder lies on the host's disk, so a
  script writing file after file would fill it. Its allocated size and its number of entries are counted.

A poll every `POLL_S` lets a fast fork or write loop pass the limit by what it does in that time, a bounded
amount; the kernel then ends every process of the namespace at once.

A script may also nest folders thousands deep, past what a path can name: `os.walk` and `shutil.rmtree`
recurse and would raise RecursionError here, outside the sandbox. So `walk(folder)` lists a tree without
recursion or following links, the watchdog ends a run that nests deeper than `SCRATCH_DEPTH`, and
`remove_tree(folder)` deletes a tree of any depth.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

TASKS = 1024  # processes and threads in the sandbox at once (the same figure as its RLIMIT_NPROC)
MEMORY_BYTES = 4 << 30  # resident memory of all its processes together (Chromium and a page take ~0.5 GB)
SCRATCH_BYTES = 256 << 20  # disk the scratch folder may take
SCRATCH_ENTRIES = 10_000  # files and folders in it
SCRATCH_DEPTH = 32  # folders inside folders
POLL_S = 0.2


def walk(folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `folder` (files, folders, links, depth first) with its lstat; links never followed."""
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                found = [(Path(e.path), e.stat(follow_symlinks=False)) for e in entries]
        except OSError:
            continue
        for path, info in sorted(found, reverse=True):
            yield path, info
            if stat.S_ISDIR(info.st_mode):
                stack.append(path)


class Watchdog:
    """Watches one sandbox run (bubblewrap's `proc`, its `--info-fd` read end, the scratch folder)."""

    def __init__(self, proc: subprocess.Popen, info_fd: int, scratch: Path) -> None:
        self.proc = proc
        self.info_fd = info_fd  # owned here: read once for the namespace's first process, then closed
        self.scratch = scratch
        self.child_pid: int | None = None  # the namespace's first process, as the host sees it
        self.reason = ""  # why the sandbox was ended early, for the model ("it ran more than ...")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qvl-sandbox-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (after bubblewrap ended); `child_pid` and `reason` are final after this."""
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        info = b""
        try:
            while chunk := os.read(self.info_fd, 4096):  # bubblewrap writes it in pieces, then closes it
                info += chunk
            self.child_pid = json.loads(info.decode() or "{}").get("child-pid")
        except (OSError, ValueError):
            return
        finally:
            os.close(self.info_fd)
        try:
            pid_ns = _namespace(self.child_pid)
        except (OSError, TypeError):
            return  # already gone
        while not self._done.wait(POLL_S):
            reason = self._over_limit(pid_ns)
            if reason and self.proc.poll() is None:
                self.reason = reason
                os.killpg(self.proc.pid, signal.SIGKILL)  # the namespace dies with bubblewrap
                return

    def _over_limit(self, pid_ns: tuple[int, int]) -> str:
        tasks, resident = _usage(pid_ns)
        if tasks > TASKS:
            return f"it ran more than {TASKS} processes and threads at once"
        if resident > MEMORY_BYTES:
            return f"its processes used more than {MEMORY_BYTES >> 20} MB of memory together"
        size = entries = 0
        for path, info in walk(self.scratch):
            entries += 1
            if len(path.relative_to(self.scratch).parts) > SCRATCH_DEPTH:
                return f"it nested folders more than {SCRATCH_DEPTH} deep"
            size += info.st_blocks * 512
            if entries > SCRATCH_ENTRIES:
                return f"it made more than {SCRATCH_ENTRIES} files and folders"
            if size > SCRATCH_BYTES:
                return f"it wrote more than {SCRATCH_BYTES >> 20} MB of files"
        return ""


def _namespace(pid: int) -> tuple[int, int]:
    info = os.stat(f"/proc/{pid}/ns/pid")
    return info.st_dev, info.st_ino


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _usage(pid_ns: tuple[int, int]) -> tuple[int, int]:
    """(processes and threads, resident bytes of their own) of the host's processes in PID namespace `pid_ns`."""
    tasks = resident = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if _namespace(int(name)) != pid_ns:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
            with open(f"/proc/{name}/statm", "rb") as f:
                pages = f.read().split()
            tasks += int(fields[17])  # num_threads, the 20th field
            # Resident minus shared: the process's own memory, not the libraries every process maps.
            resident += (int(pages[1]) - int(pages[2])) * PAGE_BYTES
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return tasks, resident


def remove_tree(folder: Path) -> None:
    """Delete `folder` and everything in it, however deep, never following a link: each folder's subfolders
    are moved up into `folder` itself before it is emptied, so no path used is longer than two names."""
    flat = itertools.count()
    try:
        top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        pending = [""]  # names of folders directly in `folder`; "" is `folder` itself
        while pending:
            name = pending.pop()
            with contextlib.suppress(OSError):
                if name:
                    os.chmod(name, 0o700, dir_fd=top)  # a script may have made it unreadable to its owner
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top) if name else os.dup(top)
                try:
                    with os.scandir(fd) as found:
                        entries = list(found)
                    for entry in entries:
                        with contextlib.suppress(OSError):
                            if not entry.is_dir(follow_symlinks=False):
                                os.unlink(entry.name, dir_fd=fd)
                            elif name:
                                moved = f".flat-{next(flat)}"
                                os.rename(entry.name, moved, src_dir_fd=fd, dst_dir_fd=top)
                                pending.append(moved)
                            else:
                                pending.append(entry.name)
                finally:
                    os.close(fd)
                if name:
                    os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):  # what could not be removed stays; the run's result matters more
        os.rmdir(folder)
