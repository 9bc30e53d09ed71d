"""Small tray widgets offscreen: the launcher shows all of its text, the marker's shape leaves its target free.
(On the virtual display, test_tray_e2e checks the marker's pixels on the real screen.)"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qapp_args():
    return ["qvl-agent-tests", "-platform", "offscreen"]


def fits(label) -> bool:
    return label.height() >= label.heightForWidth(label.width()) and label.width() > 0


def test_the_launcher_grows_with_its_status_and_cuts_no_text_off(qtbot):
    from PySide6.QtGui import QAction

    from qvl_agent.ui.launcher import Launcher

    actions = [QAction(text) for text in ("Ask about screen", "Ask about region", "Run a task…", "Settings", "Quit")]
    notice = "No system tray was found on this desktop: a small launcher window stands in for the tray icon."
    launcher = Launcher(actions, notice)
    qtbot.addWidget(launcher)
    launcher.show()
    qtbot.waitExposed(launcher)
    assert fits(launcher.notice) and fits(launcher.status)
    before = launcher.height()
    launcher.set_status(
        "The model could not be loaded: /home/someone/models/Qwen3-VL-2B-Instruct has no config.json; "
        "download it with `hf download Qwen/Qwen3-VL-2B-Instruct --local-dir DIR` and point Settings at it."
    )
    qtbot.waitUntil(lambda: launcher.height() > before)
    assert fits(launcher.notice) and fits(launcher.status)


def test_the_marker_is_a_ring_with_ticks_and_a_free_centre():
    from PySide6.QtCore import QPoint

    from qvl_agent.ui.overlay import ClickMarker

    shape, c, size = ClickMarker.shape(), ClickMarker.SIZE // 2, ClickMarker.SIZE
    free = [QPoint(c + dx, c + dy) for dx in range(-5, 6) for dy in range(-5, 6)]
    assert not any(shape.contains(p) for p in free)  # the target shows through
    assert not any(shape.contains(QPoint(x, y)) for x in (0, size - 1) for y in (0, size - 1))  # no square
    ring = [QPoint(c - 22, c), QPoint(c + 21, c), QPoint(c, c - 22), QPoint(c, c + 21), QPoint(c + 15, c + 15)]
    assert all(shape.contains(p) for p in ring)
    ticks = [QPoint(c, c - 12), QPoint(c, c + 12), QPoint(c - 12, c), QPoint(c + 12, c)]
    assert all(shape.contains(p) for p in ticks)
