"""One tray app per user: a lock file, plus a local socket that takes commands from later starts.

The lock (QLockFile, which also clears locks left by a crashed process) decides who runs; the socket lets
`qvl-agent tray --send ask|region|stop|takeover|quit` drive the running instance, which is also how a Wayland
desktop shortcut can stand in for a global hotkey. The key is derived from the user and the settings folder,
so one person has one instance, and test runs with their own QVL_CONFIG_DIR never meet the real one.

Protocol: a client connects, writes one command word and a newline, and reads back "ok" or "unknown".
"""

from __future__ import annotations

import getpass
import hashlib
import tempfile
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, QStandardPaths, QTimer, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

COMMANDS = ("ask", "region", "task", "stop", "takeover", "settings", "quit", "ping")


def runtime_dir() -> Path:
    location = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.RuntimeLocation)
    return Path(location or tempfile.gettempdir())


def instance_key(config_dir: Path) -> str:
    digest = hashlib.sha1(str(config_dir.expanduser().resolve()).encode()).hexdigest()[:10]
    return f"qvl-agent-{getpass.getuser()}-{digest}"


class SingleInstance(QObject):
    """Holds the per-user lock and serves the command socket while the tray app runs."""

    command = Signal(str)

    def __init__(self, config_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        base = runtime_dir() / instance_key(config_dir)
        self.lock_path = base.with_suffix(".lock")
        self.socket_path = base.with_suffix(".sock")
        self._lock = QLockFile(str(self.lock_path))
        self._lock.setStaleLockTime(0)  # stale only when its process is gone, never by age
        self._server: QLocalServer | None = None

    def acquire(self) -> bool:
        """True when this process is now the instance; False when another one runs."""
        if not self._lock.tryLock(0):
            return False
        QLocalServer.removeServer(str(self.socket_path))  # a socket left by a crash
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(str(self.socket_path)):
            self._lock.unlock()
            return False
        server.newConnection.connect(self._accept)
        self._server = server
        return True

    def holder_pid(self) -> int | None:
        info = self._lock.getLockInfo()  # (pid, host, app), led by a success flag in some bindings
        numbers = [v for v in info if isinstance(v, int) and not isinstance(v, bool)]
        return numbers[0] if numbers and numbers[0] > 0 else None

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._lock.unlock()

    def _accept(self) -> None:
        while self._server is not None and self._server.hasPendingConnections():
            conn = self._server.nextPendingConnection()
            conn.readyRead.connect(lambda conn=conn: self._read(conn))
            conn.disconnected.connect(conn.deleteLater)

    def _read(self, conn: QLocalSocket) -> None:
        if not conn.canReadLine():
            return
        word = bytes(conn.readLine().data()).decode(errors="replace").strip()
        known = word in COMMANDS
        conn.write(b"ok\n" if known else b"unknown\n")
        conn.flush()
        if known and word != "ping":
            # Later, from the event loop: a command may open a modal dialog, and a nested event loop
            # inside this socket's own handler would delete the socket under our feet when it closes.
            QTimer.singleShot(0, lambda: self.command.emit(word))


def send(config_dir: Path, command: str, timeout_ms: int = 3000) -> str | None:
    """Send one command to the running instance; its reply, or None when none is running."""
    from PySide6.QtCore import QCoreApplication

    _app = QCoreApplication.instance() or QCoreApplication(["qvl-agent"])  # QStandardPaths wants one
    path = str((runtime_dir() / instance_key(config_dir)).with_suffix(".sock"))
    sock = QLocalSocket()
    sock.connectToServer(path)
    if not sock.waitForConnected(timeout_ms):
        return None
    sock.write(f"{command}\n".encode())
    sock.waitForBytesWritten(timeout_ms)
    reply = ""
    if sock.waitForReadyRead(timeout_ms):
        reply = bytes(sock.readAll().data()).decode(errors="replace").strip()
    sock.disconnectFromServer()
    return reply
