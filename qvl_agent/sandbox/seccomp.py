"""The seccomp filter of the sandbox: no process inside may make a user namespace, nor System V shared
memory or message queues.

A new user namespace would give a process inside every capability again (within it), and with them new
PID, mount and network namespaces the watchdog and the forwarder know nothing about. bubblewrap's own
`--disable-userns` does this by nesting the sandbox in a second user namespace, but a process there has no
capability over the network namespace, which the relays of origins on ports below 1024 (http, https)
need to listen on. So the rule is a classic BPF program handed to bubblewrap (`--seccomp FD`), as Flatpak
does it:

- `unshare` and `clone` with CLONE_NEWUSER in their flags fail with EPERM;
- `clone3`, whose flags lie in memory a filter cannot read, fails with ENOSYS (C libraries then fall back
  to `clone`, which the rule above sees);
- `shmget` and `msgget` fail with EPERM: a System V segment or queue lives in the sandbox's IPC namespace
  with no process holding it, where the watchdog cannot see it (mapped or not), up to the kernel's
  defaults of gigabytes. Chromium uses memfds; nothing a script needs uses these;
- system calls of another ABI (i386 or x32 on x86-64) fail with ENOSYS: their numbers differ, and the
  rules above would not see them.

`filter_program()` returns the program's bytes for this machine, or None on an architecture it does not
know (the sandbox then refuses to start: see `sandbox.bubblewrap_problem`).
"""

from __future__ import annotations

import platform
import struct

CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38

# machine -> (AUDIT_ARCH_*, clone, unshare, clone3, shmget, msgget)
_ARCHES = {
    "x86_64": (0xC000003E, 56, 272, 435, 29, 68),
    "aarch64": (0xC00000B7, 220, 97, 435, 194, 186),
}
X32_BIT = 0x40000000  # x32 system calls carry this bit on x86-64

_LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (the low half first)
_NR, _ARCH, _ARG0 = 0, 4, 16


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    found = _ARCHES.get(machine or platform.machine())
    if found is None:
        return None
    arch, clone, unshare, clone3, shmget, msgget = found
    return b"".join(
        [
            _op(_LD_ABS_W, _ARCH),
            _op(_JEQ, arch, 1, 0),  # 1
            _op(_RET, _ERRNO | ENOSYS),  # 2: another ABI
            _op(_LD_ABS_W, _NR),  # 3
            _op(_JGE, X32_BIT, 0, 1),  # 4
            _op(_RET, _ERRNO | ENOSYS),  # 5: x32
            _op(_JEQ, clone3, 0, 1),  # 6
            _op(_RET, _ERRNO | ENOSYS),  # 7
            _op(_JEQ, shmget, 0, 1),  # 8
            _op(_RET, _ERRNO | EPERM),  # 9
            _op(_JEQ, msgget, 0, 1),  # 10
            _op(_RET, _ERRNO | EPERM),  # 11
            _op(_JEQ, unshare, 1, 0),  # 12
            _op(_JEQ, clone, 0, 3),  # 13
            _op(_LD_ABS_W, _ARG0),  # 14: the flags (their low 32 bits)
            _op(_JSET, CLONE_NEWUSER, 0, 1),  # 15
            _op(_RET, _ERRNO | EPERM),  # 16
            _op(_RET, _ALLOW),  # 17
        ]
    )
