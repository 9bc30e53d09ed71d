"""`qvl-agent doctor`: check what qvl-agent needs on this machine and say how to fix what is missing.

    qvl-agent doctor [--model ...] [--engine ...] [--device ...]

Describes the configured engine (the local model and device, the replay file or the remote server), then
checks the display server (and, under Wayland, what works through XWayland), the system tray, the GPU,
the model, a browser (searched in the same order as the browser executor), the global-hotkey backend and
bubblewrap (the sandbox of `playwright --verify`).
Each line is "ok", "note" (works, with a limitation) or "FAIL" followed by how to fix it. Exit 0 when
nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from qvl_agent import capture
from qvl_agent.cli import add_engine_args
from qvl_agent.config import Settings, download_command

PROBE_TIMEOUT_S = 30
# Said with every missing model: a person can try everything but the model's answers before downloading it.
WITHOUT_WEIGHTS = (
    "To try qvl-agent without the weights, pass --engine replay:FILE (a JSON array of recorded replies, "
    "see docs/engine.md#the-replay-engine)."
)
REMOTE_TIMEOUT_S = 5  # a model server that takes longer to list its models is as good as down


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # ok | note | fail
    detail: str
    fix: str = ""


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the display, tray, GPU, model, browser and hotkeys",
                       description=__doc__.splitlines()[0])  # fmt: skip
    add_engine_args(p)
    p.set_defaults(func=run)


XWAYLAND_NOTE = (
    "Wayland session with XWayland: screen capture and clicks go through XWayland, so native Wayland "
    "windows may capture black or ignore synthetic input on some desktops, and global hotkeys fire only "
    "while an X11 window has focus."
)


def check_engine(settings: Settings) -> Check:
    """What the model commands will use, as configured (flags over QVL_* variables over the settings file)."""
    from qvl_agent.engine import describe_engine

    known = settings.engine == "local" or settings.engine.startswith(("replay:", "openai:"))
    return Check("engine", "ok" if known else "note", describe_engine(settings))


def check_profile(settings: Settings) -> Check:
    """Which model profile grounding will use, and why (qvl-agent models lists them)."""
    from qvl_agent.profiles import choose

    profile, note = choose(settings.model, settings.profile)
    if settings.profile:
        text = f"{profile.name} ({profile.title}), set by --profile or the profile setting"
    else:
        text = note.rstrip(".") or f"{profile.name} ({profile.title}), the default model's profile"
    drives = "it drives run and browse" if profile.drives_agent else "it only grounds: run and browse need --planner"
    return Check("profile", "ok", f"{text}; {drives}.")


def check_display() -> Check:
    problem = capture.display_problem()
    if problem:
        if capture.display_kind() == "wayland":
            fix = "enable XWayland (it provides DISPLAY), or log in to an X11 session."
        else:
            fix = "run inside a desktop session, or start a virtual one: Xvfb :99 & export DISPLAY=:99"
        return Check("display", "fail", problem, fix)
    try:
        monitors = capture.list_monitors()[1:]
    except Exception as exc:  # CaptureError, or an Xlib error from a display that went away
        return Check("display", "fail", str(exc), "check that DISPLAY names a running X server you may use.")
    sizes = ", ".join(f"{m.width}x{m.height}" for m in monitors)
    where = capture.display_name()
    if capture.display_kind() == "xwayland":
        return Check("display", "note", f"{XWAYLAND_NOTE} Monitors: {sizes}.",
                     "for full control log in to an X11 session; otherwise prefer X11 apps.")  # fmt: skip
    return Check("display", "ok", f"{where}, {len(monitors)} monitor(s): {sizes}")


def probe_desktop() -> dict:
    """Qt's view of the desktop, from a child process (Qt aborts when its platform plugin fails)."""
    env = dict(os.environ)
    env.pop("QT_QPA_PLATFORM", None)  # probe the real platform, not an offscreen test setting
    try:
        out = subprocess.run(
            [sys.executable, "-m", "qvl_agent.ui.probe"], capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"the desktop probe did not answer within {PROBE_TIMEOUT_S} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"Qt could not start here ({last})"}
    return json.loads(lines[-1])


def check_tray(desktop: dict) -> Check:
    if "error" in desktop:
        return Check(
            "system tray",
            "fail",
            desktop["error"],
            "fix the display first; on Linux install Qt's xcb libraries (scripts/setup lists them).",
        )
    if desktop.get("tray"):
        return Check("system tray", "ok", f"available ({desktop.get('platform')})")
    return Check(
        "system tray", "note", "no system tray: `qvl-agent tray` shows a small launcher window instead.",
        "use a panel with a tray (GNOME: the AppIndicator extension; or run trayer/stalonetray).",
    )  # fmt: skip


def check_hotkeys(desktop: dict) -> Check:
    if "error" in desktop:
        return Check("hotkeys", "fail", "not checked: " + desktop["error"], "fix the display first.")
    error = desktop.get("hotkeys_error", "")
    if capture.display_kind() == "xwayland":
        return Check(
            "hotkeys",
            "note",
            "Wayland: pynput hears hotkeys only while an XWayland window has focus.",
            "bind desktop keyboard shortcuts to `qvl-agent tray --send ask` (and `--send region`, `--send stop`).",
        )
    if error:
        return Check(
            "hotkeys",
            "fail",
            error,
            "on X11 the server needs the RECORD extension; on macOS allow Accessibility access.",
        )
    return Check("hotkeys", "ok", "pynput global hotkeys work (X11)" if capture.display_kind() == "x11" else "pynput")


def check_gpu(settings: Settings) -> Check:
    try:
        import torch
    except Exception as exc:
        return Check("gpu", "fail", f"torch cannot be imported: {exc}", "reinstall: scripts/setup")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return Check("gpu", "ok", f"{props.name}, {props.total_memory / 2**30:.0f} GiB (torch {torch.__version__})")
    if settings.device.startswith("cuda"):
        return Check(
            "gpu",
            "fail",
            f"device is {settings.device} but torch sees no CUDA GPU.",
            "install the NVIDIA driver and a CUDA build of torch, or set device to auto/cpu.",
        )
    return Check(
        "gpu",
        "note",
        "no CUDA GPU: the model runs on the CPU, taking seconds per answer.",
        "for sub-second answers use a machine with an NVIDIA GPU, or --engine openai:URL to a server.",
    )


def check_model(settings: Settings) -> Check:
    if settings.engine.startswith("replay:"):
        path = Path(settings.engine.removeprefix("replay:"))
        if path.is_file():
            return Check("model", "ok", f"replay engine {path}: no model needed")
        return Check("model", "fail", f"the replay file {path} does not exist.", "pass an existing JSON file.")
    if settings.engine.startswith("openai:"):
        return check_remote(settings)
    if settings.engine != "local":
        return Check("model", "fail", f"unknown engine {settings.engine!r}.",
                     "use --engine local, replay:FILE or openai:URL (or fix engine in the settings).")  # fmt: skip
    check = _check_local_model(settings.model)
    return check if check.level == "ok" else replace(check, fix=f"{check.fix.rstrip('.')}. {WITHOUT_WEIGHTS}")


def _check_local_model(model: str) -> Check:
    path = Path(model).expanduser()
    download = f"{download_command(model)}, then set model to DIR"
    if path.is_dir() or model.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            return Check(
                "model",
                "fail",
                f"{path} holds no model (no config.json).",
                "point --model (or the model setting) at a folder from save_pretrained or a download.",
            )
        if not list(path.glob("*.safetensors")) and not list(path.glob("*.bin")):
            return Check("model", "fail", f"{path} has a config but no weights.", "download the weights again.")
        return Check("model", "ok", f"local folder {path}")
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return Check("model", "fail", "huggingface_hub is missing.", "reinstall: scripts/setup")
    cached = try_to_load_from_cache(model, "config.json")
    if isinstance(cached, str):
        snapshot = Path(cached).parent
        if list(snapshot.glob("*.safetensors")):
            return Check("model", "ok", f"{model} in the Hugging Face cache ({snapshot})")
        return Check("model", "fail", f"{model} is in the cache without its weights.", download)
    return Check("model", "fail", f"{model} is not in the Hugging Face cache (first use downloads it).", download)


def check_remote(settings: Settings) -> Check:
    """Ask the server at openai:URL which models it serves, as the remote engine does before its first turn."""
    from qvl_agent.engine.remote import RemoteEngine
    from qvl_agent.errors import QvlError

    url = settings.engine.removeprefix("openai:")
    try:
        engine = RemoteEngine(url, api_key=settings.api_key, model=settings.model, timeout_s=REMOTE_TIMEOUT_S)
        try:
            model = engine.model
        finally:
            engine.close()
    except QvlError as exc:
        return Check("model", "fail", str(exc), "start the server (e.g. qvl-agent serve) or correct the URL and key.")
    return Check("model", "ok", f"remote engine {engine.base_url} serves {model}")


def playwright_chromium() -> str | None:
    """Playwright's own Chromium, when one was installed with `playwright install chromium`."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            path = p.chromium.executable_path
        return path if path and Path(path).is_file() else None
    except Exception:  # no driver, no install: not finding one is the answer
        return None


def check_browser(settings: Settings) -> Check:
    from qvl_agent.errors import BrowserError
    from qvl_agent.playwright.chromium import find_browser

    try:
        found = find_browser(None, settings.browser, playwright_chromium())
    except BrowserError as exc:
        return Check("browser", "fail", str(exc),
                     "apt install chromium (or set QVL_BROWSER to a Chromium executable).")  # fmt: skip
    origin = "QVL_BROWSER / settings" if settings.browser else "found"
    return Check("browser", "ok", f"{found} ({origin})")


def check_sandbox() -> Check:
    """bubblewrap, which `playwright --verify` runs model-written scripts in."""
    from qvl_agent.sandbox.bubblewrap import PACKAGE, bubblewrap_problem

    problem = bubblewrap_problem()
    if problem is None:
        from qvl_agent.sandbox.cgroup import enforcement

        return Check("script sandbox", "ok", f"bubblewrap starts sandboxes for replay and --verify; {enforcement()}")
    level = "fail" if sys.platform.startswith("linux") else "note"
    return Check("script sandbox", level, f"{problem} playwright --verify refuses to run scripts without it.",
                 f"apt install {PACKAGE} (or your system's package of that name).")  # fmt: skip


def run(args: argparse.Namespace, settings: Settings) -> int:
    display = check_display()
    checks = [check_engine(settings), check_profile(settings), display]
    desktop = probe_desktop() if display.level != "fail" else {"error": "no display"}
    checks += [check_tray(desktop), check_gpu(settings), check_model(settings), check_browser(settings)]
    checks.append(check_hotkeys(desktop))
    checks.append(check_sandbox())
    labels = {"ok": "ok  ", "note": "note", "fail": "FAIL"}
    for c in checks:
        print(f"{labels[c.level]}  {c.name}: {c.detail}")
        if c.fix and c.level != "ok":
            print(f"      fix: {c.fix}")
    failed = [c.name for c in checks if c.level == "fail"]
    print("All checks passed." if not failed else f"{len(failed)} problem(s): {', '.join(failed)}.")
    return 1 if failed else 0
