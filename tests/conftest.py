"""Shared fixtures: a virtual display with a tray-capable window manager, and the tiny Qwen3-VL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.display import VirtualDisplay, display_works, ensure_runtime_dir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def x_display():
    """DISPLAY of a live X server with jwm: the one scripts/test started, else a private one."""
    ensure_runtime_dir()
    existing = os.environ.get("DISPLAY", "")
    if display_works(existing):
        yield existing
        return
    vd = VirtualDisplay()
    os.environ["DISPLAY"] = vd.start()
    try:
        yield vd.display
    finally:
        vd.stop()
        if existing:
            os.environ["DISPLAY"] = existing
        else:
            os.environ.pop("DISPLAY", None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen3-VL saved with save_pretrained, built once per test session."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-model"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(path)], check=True, cwd=ROOT)
    return path


def run_cli(*args: str, env: dict | None = None, timeout: float = 300, input: str | None = None, cwd=None):
    """Run `python -m qvl_agent ARGS` as a user would; returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "qvl_agent", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        input=input,
        cwd=cwd or ROOT,
    )
