"""The core of the data flow imports no torch, Qt, pyautogui, pynput, Playwright or mss, so it stays
testable and starts fast; each module is imported in a fresh interpreter and `sys.modules` checked."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "PySide6", "pyautogui", "pynput", "playwright", "mss")
CORE = [
    "qvl_agent.agent",
    "qvl_agent.parse",
    "qvl_agent.image",
    "qvl_agent.actions",
    "qvl_agent.scripts.export.exporter",
    "qvl_agent.scripts.replay",
    "qvl_agent.sandbox.bubblewrap",
    "qvl_agent.trace",
    "qvl_agent.report",
    "qvl_agent.mcp_server.server",
    "qvl_agent.act.base",
    "qvl_agent.act.guard",
    "qvl_agent.act.desktop",
    "qvl_agent.commands.run",
]


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_nothing_heavy(module):
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} pulls in {out.stdout.strip()}"
