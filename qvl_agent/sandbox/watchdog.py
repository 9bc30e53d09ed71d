"""Limits of a running sandbox that no resource limit of the kernel enforces, checked from outside.

`Watchdog` polls the sandbox while it runs and ends it (with the reason) when all its processes together
hold more than `TASKS` processes and threads, or more than `memory_bytes` of memory, or its tmpfs folders
more than `ENTRIES` files and folders:

- **Processes:** RLIMIT_NPROC, set inside, does not hold when qvl-agent runs as root: the kernel exempts
  the global root user, and the sandbox's root is the host's root then. A fork bomb would fill the
  machine's memory and process table before the timeout. Here every task descended from bubblewrap is
  counted, whoever runs it and whatever namespace it is in.
- **Memory:** RLIMIT_DATA caps each process's heap, not shared memory, and a few processes together could
  still take the machine's memory (and the out-of-memory killer might pick the model's process instead).
  Summed here: each descendant's resident anonymous and shared memory (a shared `mmap` of a memfd
  included), every memfd held open (by its allocated size, each once, mapped or not), and what the
  sandbox's tmpfs folders (/tmp, /dev/shm, the scratch folder) hold. File-backed pages of the read-only
  system folders are the page cache, which the kernel reclaims. (A delegated cgroup v2 with
  `memory.max` and `pids.max` would hold both limits in the kernel; few desktops delegate one to a
  user's process, so this check is what holds everywhere.) Where the run has a cgroup (`cgroup.py`), the
  kernel holds the limit; the kernel's out-of-memory killer ends only the process it picks, so the run
  is ended here at the first poll after that kill: a run that lost a process to the wall stops at once
  rather than waiting out its timeout half dead.
- **Disk:** the scratch folder, /tmp and /dev/shm are sized tmpfs mounts: the kernel refuses bytes past
  their size, files unlinked while still open included. Their number of files is counted here (a tmpfs
  without a size for inodes would let a script fill kernel memory with empty files).

A poll every `POLL_S` lets a fast fork or allocation loop pass the limit by what it does in that time, a
bounded amount; the kernel then ends every process of the namespace at once. A poll reads each process's
descriptors (for memfds), so the sandbox may hold at most `DESCRIPTORS` of them: tens of thousands would
make one poll take seconds, during which nothing would be checked.

`walk(folder)` lists a tree without recursion or following links and `remove_tree(folder)` deletes a tree
of any depth: a script's folders may nest past what a path can name.
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
from collections.abc import Callable, Iterator
from pathlib import Path

TASKS = 1024  # processes and threads in the sandbox at once (the same figure as its RLIMIT_NPROC)
MEMORY_BYTES = 4 << 30  # memory of all its processes together (Chromium and a page take ~0.5 GB)
ENTRIES = 20_000  # files and folders in its tmpfs folders together
DESCRIPTORS = 20_000  # open descriptors of all its processes together: each poll reads every one
TMPFS = ("/tmp", "/dev/shm", "/scratch")  # inside the sandbox
POLL_S = 0.2


def memory_limit_reason(memory_bytes: int) -> str:
    """Why a run was ended for its memory, in the words the model and the person read."""
    return f"its processes used more than {memory_bytes >> 20} MB of memory together"


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
    """Watches one sandbox run (bubblewrap's `proc` and its `--info-fd` read end)."""

    def __init__(
        self,
        proc: subprocess.Popen,
        info_fd: int,
        memory_bytes: int | None = None,
        count_files: bool = True,
        killed_for_memory: Callable[[], bool] | None = None,
    ) -> None:
        self.proc = proc
        self.killed_for_memory = killed_for_memory  # the run's cgroup: did the kernel kill one of its processes
        # False where the kernel sizes each tmpfs folder in entries (`launch.py`): it refuses the file past
        # the limit itself, before any poll could see it.
        self.count_files = count_files
        self.info_fd = info_fd  # owned here: read once for the namespace's first process, then closed
        self.memory_bytes = memory_bytes or MEMORY_BYTES
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
        while not self._done.wait(POLL_S):
            reason = self._over_limit()
            if reason and self.proc.poll() is None:
                self.reason = reason
                os.killpg(self.proc.pid, signal.SIGKILL)  # the namespace dies with bubblewrap
                return

    def _over_limit(self) -> str:
        if self.killed_for_memory is not None and self.killed_for_memory():
            return memory_limit_reason(self.memory_bytes)
        pids = descendants(self.proc.pid)
        tasks = sum(_threads(pid) for pid in pids)
        if tasks > TASKS:
            return f"it ran more than {TASKS} processes and threads at once"
        used, entries = self._tmpfs_usage()
        if self.count_files and entries > ENTRIES:
            return f"it made more than {ENTRIES} files and folders"
        try:
            memory = used + memory_of(pids)
        except TooManyDescriptors:
            return f"it held more than {DESCRIPTORS} open files and sockets at once"
        if memory > self.memory_bytes:
            return memory_limit_reason(self.memory_bytes)
        return ""

    def _tmpfs_usage(self) -> tuple[int, int]:
        """(bytes, files and folders) in the sandbox's tmpfs folders, seen through its first process's root."""
        used = entries = 0
        for folder in TMPFS:
            try:
                fs = os.statvfs(f"/proc/{self.child_pid}/root{folder}")
            except OSError:
                continue
            used += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
            entries += fs.f_files - fs.f_ffree
        return used, entries


def descendants(root: int) -> list[int]:
    """`root` and every process descended from it (nested PID namespaces included: the host sees them all)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
            children.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[17])  # num_threads, the 20th field
    except (OSError, ValueError, IndexError):
        return 0


class TooManyDescriptors(Exception):
    """The sandbox holds more descriptors than one poll may read (`DESCRIPTORS`)."""


def memory_of(pids: list[int]) -> int:
    """Bytes held by `pids` together: each one's resident anonymous and shared memory (RssAnon + RssShmem:
    a shared mapping of a memfd or of /dev/shm counts in full for every process that maps it, which only
    counts too much), plus every memfd they hold open (each once, by its allocated size), mapped or not.

    The kernel's counters in /proc/PID/status, not the PSS of smaps_rollup: that walks every page table,
    hundreds of milliseconds a poll for a few Chromium processes on a busy machine, which a fast
    allocation loop would use to get further past the limit."""
    total = 0
    held: dict[tuple[int, int], int] = {}
    budget = DESCRIPTORS  # a poll reads at most this many: more ends the run, never stalls the watch
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith((b"RssAnon:", b"RssShmem:")):
                        total += int(line.split()[1]) * 1024
            fds = os.listdir(f"/proc/{pid}/fd")
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        budget -= len(fds)
        if budget < 0:
            raise TooManyDescriptors
        for fd in fds:
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    continue
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            held[info.st_dev, info.st_ino] = info.st_blocks * 512
    return total + sum(held.values())


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
