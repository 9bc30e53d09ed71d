"""Shared fixtures: a private home for every test session, a virtual display with a tray-capable window
manager, and the tiny Qwen3-VL. Under CI=true a skipped test counts as a failure.

Under pytest-xdist (scripts/test runs two workers per core) each worker has a display of its own, so no two
tests share a pointer, a keyboard focus or a tray; the tiny model is built once for all workers."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.display import VirtualDisplay, display_works, ensure_runtime_dir

ROOT = Path(__file__).resolve().parent.parent
REAL_HOME = Path.home()  # read before `private_home` moves HOME, so a test can prove nothing landed here
_XDG = {"XDG_DATA_HOME": ".local/share", "XDG_CONFIG_HOME": ".config", "XDG_CACHE_HOME": ".cache",
        "XDG_STATE_HOME": ".local/state"}  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def private_home(tmp_path_factory) -> Path:
    """HOME and the XDG folders in a temporary folder for the whole session (and every qvl-agent process
    the tests start), so no run, script, setting or token lands in the person's real folders."""
    home = tmp_path_factory.mktemp("home")
    saved = {var: os.environ.get(var) for var in ("HOME", *_XDG)}
    os.environ["HOME"] = str(home)
    for var, sub in _XDG.items():
        os.environ[var] = str(home / sub)
    yield home
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def _skipped_in_ci(report) -> bool:
    return os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail")


def _fail_skip(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, which must run every test: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skip is a failure: CI has every tool installed, so a skip there hides a broken setup."""
    outcome = yield
    report = outcome.get_result()
    if _skipped_in_ci(report):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped while it is collected."""
    outcome = yield
    report = outcome.get_result()
    if _skipped_in_ci(report):
        _fail_skip(report)


def pytest_collection_modifyitems(items):
    """Each worker's share starts with its part of the tests marked `slow`, dealt round, so no slow test is
    left running alone at the end while the other workers idle. The slow tests of one module that are also
    marked `same_worker` are dealt as one, in their order: they share a module-scoped fixture (a server, a
    model's run), which each worker that runs one of them would otherwise build again.

    scripts/test schedules with pytest-xdist's `worksteal`: the collected tests are cut into one share per
    worker, in order and evenly, and a worker that runs out takes half of what is left of the longest share,
    from its end. The shares are laid out here to match that cut; every worker computes the same order."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slow = _dealt_together([item for item in items if item.get_closest_marker("slow")])
    rest = [item for item in items if not item.get_closest_marker("slow")]
    ordered, left = [], len(items)
    for worker in range(workers):
        size = left // (workers - worker)  # the size of this worker's first share, as worksteal cuts it
        left -= size
        share = [item for unit in slow[worker::workers] for item in unit]
        fill = max(0, size - len(share))
        ordered += share + rest[:fill]
        rest = rest[fill:]
    items[:] = ordered + rest


def _dealt_together(slow: list) -> list[list]:
    """The slow tests as units to deal: one test each, but all the `same_worker` tests of a module in one."""
    units: list[list] = []
    modules: dict = {}
    for item in slow:
        if not item.get_closest_marker("same_worker"):
            units.append([item])
        elif item.path in modules:
            modules[item.path].append(item)
        else:
            modules[item.path] = [item]
            units.append(modules[item.path])
    return units


_WORKER_DISPLAY: VirtualDisplay | None = None


def pytest_configure(config):
    """A pytest-xdist worker starts its own display before it collects anything, and every process it
    starts inherits it: tests that move the pointer or press hotkeys never meet another worker's."""
    global _WORKER_DISPLAY
    if os.environ.get("PYTEST_XDIST_WORKER") and _WORKER_DISPLAY is None:
        ensure_runtime_dir()
        _WORKER_DISPLAY = VirtualDisplay()
        try:
            os.environ["DISPLAY"] = _WORKER_DISPLAY.start()
        except RuntimeError:
            _WORKER_DISPLAY = None  # no Xvfb here: the display tests say so themselves (and fail under CI)


def pytest_sessionfinish(session):
    """The Chromium the browser tests measure pages in (tests/pages/helpers.py) stops with the session."""
    helpers = sys.modules.get("tests.pages.helpers")
    if helpers is not None:
        helpers.MEASURING.close()


def pytest_unconfigure(config):
    if _WORKER_DISPLAY is not None:
        _WORKER_DISPLAY.stop()


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
    # The folder every worker of one run shares (pytest-xdist gives each worker a base temp inside it).
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    path = shared / "tiny-model"
    with open(shared / "tiny-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds it; the others wait and reuse it
        built = shared / "tiny-model.built"
        if not built.exists():
            subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(path)], check=True, cwd=ROOT
            )
            built.touch()
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
