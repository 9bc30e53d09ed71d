"""The files a sandboxed script wrote, received through a pipe from inside.

The scratch folder is a sized tmpfs inside the sandbox (so every byte written there counts, files unlinked
while still open included, and the host's disk never sees it). When the script ends, `init_in_sandbox.py`
sends the regular files under it through a pipe as records:

    b"F" | name length (4 bytes, big-endian) | name (the path under the scratch folder) | size (8 bytes) | data

`FileReceiver` drains the pipe on a thread (so the sender never blocks), keeps at most `limit` bytes of
file data, and parses the records afterwards, at most `MAX_FILES` of them. Everything in the stream came
from the script (it runs in the process that holds the pipe, and can write records of its own), so the
caps are here, where it cannot reach: names are returned as text and checked by whoever writes them
anywhere (`copy_back.keep_files`); a malformed or cut record ends the list.
"""

from __future__ import annotations

import os
import threading

from qvl_agent.sandbox.watchdog import ENTRIES

RECORD = b"F"
NAME_BYTES = 4096  # the longest name accepted (PATH_MAX)
MAX_FILES = ENTRIES  # no more files come out than the scratch folder may hold


class FileReceiver:
    """Reads the read end `fd` of the files pipe (owned here) until the last writer inside closes it."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit + (1 << 20)  # record headers on top of the file data
        self.data = bytearray()
        self.cut = False
        self._thread = threading.Thread(target=self._read, name="qvl-sandbox-files", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                if len(self.data) < self.limit:
                    self.data += chunk[: self.limit - len(self.data)]
                else:
                    self.cut = True  # keep draining: the sender must not block on a full pipe
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def result(self, wait_s: float) -> dict[str, bytes]:
        """The files received (at most `limit` bytes of data); after `wait_s` a still-open pipe is left."""
        self._thread.join(wait_s)
        return parse_files(bytes(self.data))


def parse_files(data: bytes) -> dict[str, bytes]:
    """The complete records of `data`, in order, at most MAX_FILES of them: {name: content}."""
    files: dict[str, bytes] = {}
    at = 0
    while at < len(data) and len(files) < MAX_FILES:
        if data[at : at + 1] != RECORD or at + 5 > len(data):
            break
        size_name = int.from_bytes(data[at + 1 : at + 5], "big")
        if not 0 < size_name <= NAME_BYTES or at + 5 + size_name + 8 > len(data):
            break
        name = data[at + 5 : at + 5 + size_name].decode("utf-8", "replace")
        at += 5 + size_name
        size = int.from_bytes(data[at : at + 8], "big")
        at += 8
        if at + size > len(data):
            break  # cut at the limit: the last file is incomplete, so not returned at all
        files[name] = data[at : at + size]
        at += size
    return files
