"""Memory and processes of one sandbox run, limited by the kernel: a cgroup of its own.

Every page the run's processes make is charged to their cgroup, whatever kind it is and wherever it went:
anonymous and shared memory, tmpfs files, a memfd whose descriptor was closed, parked in a unix socket
or handed to another process, data queued in socket buffers and the kernel's other memory for them. Past
`memory_bytes` the kernel reclaims, then kills inside the cgroup, and nothing outside it is touched;
past `tasks` no process or thread can be made, root's included. Nothing here needs to know what the
script does, and nothing the script does reaches these files: the sandbox shows no cgroup filesystem.

Where a cgroup comes from (`Cgroup.make`), the first that works:

- cgroup v2 with the `memory` and `pids` controllers enabled below this process's cgroup (a container
  whose root is ours, or a delegated systemd scope): a child of that cgroup;
- cgroup v1, where the `memory` and `pids` hierarchies are mounted and this process may write them (root,
  as on this project's test machines): a child of this process's own cgroup in each.

Else None: the watchdog (`watchdog.py`) is the only memory and process limit, and `enforcement()` says
so for `doctor` and the replay's first line.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_names = itertools.count()


def _own_path(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of `controller`, or in v2 for controller ""."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller == "" and controllers == "") or controller in controllers.split(","):
            return path
    return None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


@dataclass
class Cgroup:
    """One run's cgroup: `folders` holds one (v2) or two (v1: memory, pids) cgroup folders."""

    version: int
    folders: list[Path]
    memory_bytes: int

    @classmethod
    def make(cls, memory_bytes: int, tasks: int) -> Cgroup | None:
        """A new cgroup limited to `memory_bytes` and `tasks`, or None where none can be made here."""
        name = f"qvl-sandbox-{os.getpid()}-{next(_names)}"
        for make in (cls._v2, cls._v1):
            try:
                made = make(name, memory_bytes, tasks)
            except OSError:
                continue
            if made is not None:
                return made
        return None

    @classmethod
    def _v2(cls, name: str, memory_bytes: int, tasks: int) -> Cgroup | None:
        own = _own_path("")
        if own is None or not (ROOT / "cgroup.controllers").is_file():
            return None
        folder = ROOT / own.lstrip("/") / name
        folder.mkdir()
        made = cls(2, [folder], memory_bytes)
        try:
            _write(folder / "memory.max", str(memory_bytes))
            _write(folder / "memory.swap.max", "0")
            _write(folder / "pids.max", str(tasks))
        except OSError:
            made.remove()  # the controllers are not ours to use below this cgroup
            return None
        with contextlib.suppress(OSError):  # kernels before 4.19: the watchdog ends the run after a kill
            _write(folder / "memory.oom.group", "1")  # one kill for memory ends every process of the run
        return made

    @classmethod
    def _v1(cls, name: str, memory_bytes: int, tasks: int) -> Cgroup | None:
        memory, pids = _own_path("memory"), _own_path("pids")
        if memory is None or pids is None:
            return None
        folders = [ROOT / "memory" / memory.lstrip("/") / name, ROOT / "pids" / pids.lstrip("/") / name]
        made = cls(1, [], memory_bytes)
        try:
            for folder in folders:
                folder.mkdir()
                made.folders.append(folder)
            _write(folders[0] / "memory.limit_in_bytes", str(memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: then there is no swap to escape to
                _write(folders[0] / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(folders[1] / "pids.max", str(tasks))
        except OSError:
            made.remove()
            return None
        return made

    def procs_files(self) -> list[Path]:
        """The files a process writes its pid to, to move into the cgroup (`launch.launcher` does it)."""
        return [folder / "cgroup.procs" for folder in self.folders]

    def killed_for_memory(self) -> bool:
        """Whether the kernel killed a process of the run for passing the memory limit."""
        events = self.folders[0] / ("memory.events" if self.version == 2 else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def remove(self, wait_s: float = 5.0) -> None:
        """Delete the cgroup once its last process is gone (the kernel refuses while one is left)."""
        deadline = time.monotonic() + wait_s
        for folder in reversed(self.folders):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break  # a process is still exiting; an empty cgroup left behind holds nothing
                    time.sleep(0.02)


def enforcement(memory_bytes: int = 256 << 20, tasks: int = 64) -> str:
    """One sentence: what limits a sandbox's memory and processes on this machine (for `doctor`)."""
    probe = Cgroup.make(memory_bytes, tasks)
    if probe is None:
        return (
            "memory and processes are limited by qvl-agent's watchdog (no cgroup can be made here: "
            "run as root with cgroup v1, or with the memory and pids controllers delegated in cgroup v2)"
        )
    probe.remove()
    return f"memory and processes are limited by the kernel (a cgroup v{probe.version} for each run)"
