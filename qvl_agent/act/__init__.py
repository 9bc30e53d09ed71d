"""Carrying out actions: the executor contract (`base`), the executors (`desktop` with pyautogui,
`dry_run`, and `browser` with Playwright), the safety guard (`guard`) and the key-name table (`keys`).

Importing this package imports no GUI library: pyautogui, pynput and Playwright are imported lazily by
the modules that need them, because importing them without a display raises.
"""

from qvl_agent.act.base import ActionResult, Executor

__all__ = ["ActionResult", "Executor"]
