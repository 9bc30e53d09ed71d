"""What the desktop offers the tray app, probed in a child process by `qvl-agent doctor`.

    python -m qvl_agent.ui.probe   → one JSON object on stdout

Qt aborts the whole process when its platform plugin cannot start, so `doctor` runs this in a child and
reads the JSON: the Qt platform, whether a system tray is there, and whether pynput can hear global
hotkeys (it starts and stops a real listener).
"""

from __future__ import annotations

import json
import sys


def probe_hotkeys() -> str:
    """ "" when a pynput global-hotkey listener starts here, else why not (one sentence)."""
    try:
        from pynput import keyboard

        listener = keyboard.GlobalHotKeys({"<ctrl>+<alt>+<f12>": lambda: None})
        listener.start()
        listener.wait()
        listener.stop()
        backend = keyboard.Listener.__module__  # pynput.keyboard._xorg on X11
        if "xorg" not in backend and sys.platform.startswith("linux"):
            return f"pynput uses the {backend} backend, which cannot hear global hotkeys."
        return ""
    except Exception as exc:  # ImportError without a display, Xlib errors without the RECORD extension
        return f"pynput cannot listen for global hotkeys: {exc}"


def main() -> int:
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon

    app = QApplication.instance() or QApplication(["qvl-agent-probe"])
    result = {
        "platform": app.platformName(),
        "tray": QSystemTrayIcon.isSystemTrayAvailable(),
        "screens": [
            {
                "name": s.name(),
                "width": s.geometry().width(),
                "height": s.geometry().height(),
                "scale": s.devicePixelRatio(),
            }
            for s in app.screens()
        ],  # fmt: skip
        "hotkeys_error": probe_hotkeys(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
