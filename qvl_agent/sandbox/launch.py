"""What runs before bubblewrap, in the process that becomes it: the kernel's limits, set up where they can be.

`launcher(cgroup_procs, tmpfs)` is the command prefix that starts bubblewrap:

- it writes its own pid into each `cgroup.procs` file first (`cgroup.py`), so bubblewrap and everything
  it starts are born in the run's cgroup, with no moment outside it;
- as root, in a mount namespace of its own (`unshare --mount`, private: nothing shows on the host), it
  mounts each tmpfs folder sized in bytes **and in entries** (`nr_inodes`), which bubblewrap's `--size`
  cannot set. bubblewrap then binds them in as /tmp, /dev/shm and the scratch folder, and the kernel
  refuses the file one past `ENTRIES`, however fast a script makes them. Elsewhere bubblewrap's own
  `--size` tmpfs is used and the watchdog counts files.

Then it execs bubblewrap: one process, one pid, from the start to the end of the run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from qvl_agent.sandbox.watchdog import ENTRIES

# $1: cgroup.procs files and $2: DIR=BYTES tmpfs mounts, each ":"-separated; $3: entries per tmpfs; then
# the command. The paths are ours (a cgroup folder, a folder made by mkdtemp), never the script's.
_SCRIPT = (
    "set -e; procs=$1; mounts=$2; entries=$3; shift 3; IFS=:; "
    'for p in $procs; do echo $$ > "$p"; done; '
    'for m in $mounts; do mount -t tmpfs -o "size=${m##*=},nr_inodes=$entries,mode=0755,nosuid,nodev" '
    'tmpfs "${m%=*}"; done; '
    'unset IFS; exec "$@"'
)


@functools.cache
def can_size_entries() -> bool:
    """Whether tmpfs folders sized in entries can be mounted for a run here (root, and `unshare` works)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        return False
    with tempfile.TemporaryDirectory(prefix="qvl-probe-") as folder:
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SCRIPT, "sh", "", f"{folder}=65536",
             "16", "true"],
            capture_output=True, timeout=30,
        )  # fmt: skip
    return probe.returncode == 0


def launcher(cgroup_procs: Sequence[Path], tmpfs: Mapping[Path, int]) -> list[str]:
    """The prefix of bubblewrap's command line: enter the cgroup, mount `tmpfs` ({host folder: bytes},
    empty where `can_size_entries` is False), then exec the rest. Empty when there is nothing to do."""
    for path in (*cgroup_procs, *tmpfs):
        if ":" in str(path):
            raise ValueError(f"A sandbox folder's path holds ':', which separates them here: {path}")
    if not cgroup_procs and not tmpfs:
        return []
    mounts = ":".join(f"{folder}={size}" for folder, size in tmpfs.items())
    procs = ":".join(str(path) for path in cgroup_procs)
    script = ["sh", "-c", _SCRIPT, "sh", procs, mounts, str(ENTRIES + 1)]  # + the tmpfs's own root folder
    return (["unshare", "--mount", "--propagation", "private"] if tmpfs else []) + script
