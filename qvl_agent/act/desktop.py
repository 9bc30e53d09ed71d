"""Carrying out actions on the real desktop with pyautogui, and watching it with mss.

All OS input goes through `self.input` (the pyautogui module, imported on first use because importing it
without a display raises), so a test can hand in another object with the same few functions. On X11 it is
pyautogui with typed text going through XTest instead (`act.x11_typing`): pyautogui's X11 key table turns
"<" into ">" and cannot type beyond ASCII; Windows and macOS type through pyautogui itself.

Safety, in this order: every point comes from `image.to_pixels` through the screenshot the model looked
at, so it lies on the captured screen; a target that falls on one of pyautogui's fail-safe corners is
moved one pixel inwards, so the fail-safe keeps meaning "the person shoved the pointer into a corner", and
when it fires the run stops with `EmergencyStop`. pyautogui's default 0.1 s pause after every call is
turned down to a few milliseconds: the agent waits for the screen to settle instead.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import nullcontext

from qvl_agent import actions as A
from qvl_agent import capture
from qvl_agent.act.base import ActionResult
from qvl_agent.act.keys import canonical
from qvl_agent.act.x11_typing import X11Input
from qvl_agent.errors import ActionError, CaptureError, EmergencyStop
from qvl_agent.image import Region, Screenshot, to_pixels

PAUSE_S = 0.005  # after each pyautogui call; X servers and toolkits keep up with this easily
# Keys typed right after a click wait this long from the click: the clicked app moves its keyboard focus
# when it handles the click, which a busy machine may do after the first keys arrived.
CLICK_TO_KEYS_S = 0.15
DRAG_S = 0.2  # toolkits miss drags that jump straight to the end point
MAX_SCROLL_CLICKS = 50


def _load_pyautogui():
    problem = capture.display_problem()
    if problem:
        raise CaptureError(problem)
    try:
        import pyautogui
    except Exception as exc:  # Xlib raises its own errors when the display cannot be opened
        raise CaptureError(f"Cannot control the pointer and keyboard on this display: {exc}.") from None
    pyautogui.PAUSE = PAUSE_S
    pyautogui.FAILSAFE = True  # kept for the person: shove the pointer into a corner to stop
    return pyautogui


def _load_input(platform: str):
    pyautogui = _load_pyautogui()
    if platform.startswith("linux"):  # X11, or XWayland (display_problem refused bare Wayland)
        return X11Input(pyautogui)
    return pyautogui


def key_name(key: str, platform: str = sys.platform) -> str:
    """Qwen3-VL's key name -> pyautogui's (e.g. "Return" -> "enter", "cmd" -> "command" on macOS)."""
    name = canonical(key)
    if name == "win" and platform == "darwin":
        name = "command"
    return name


class DesktopExecutor:
    """Executes actions with pyautogui; observes a monitor (1-based) or a region with mss."""

    name = "desktop"

    def __init__(
        self,
        monitor: int | None = None,
        region: Region | None = None,
        input_backend=None,
        interrupt: Callable[[], None] | None = None,
        grab: Callable[..., Screenshot] = capture.grab,
        platform: str = sys.platform,
    ):
        self.monitor = monitor
        self.platform = platform
        self.region = region
        self._input = input_backend
        self.interrupt = interrupt or (lambda: None)  # raises EmergencyStop; checked between keystrokes
        self._grab = grab
        self._settled: Screenshot | None = None
        self._clicked_at = float("-inf")  # when the last click ended (time.monotonic)
        self.reused_capture = False  # the last observe() returned the settled grab instead of a new one

    @property
    def input(self):
        if self._input is None:
            self._input = _load_input(self.platform)
        return self._input

    # --- watching -------------------------------------------------------------------------------------

    def observe(self) -> Screenshot:
        shot, self._settled = self._settled, None
        self.reused_capture = shot is not None
        return shot or self._grab(monitor=self.monitor, region=self.region)

    def wait_until_settled(self, timeout_s: float, interval_s: float = 0.05) -> None:
        """Grab until two grabs in a row are identical (the app has redrawn), or until `timeout_s`.
        The last grab is what `observe` returns next, so a settled screen is never captured twice."""
        deadline = time.monotonic() + timeout_s
        time.sleep(min(interval_s, timeout_s))  # give the app a moment to receive the events
        last = self._grab(monitor=self.monitor, region=self.region)
        while time.monotonic() < deadline:
            time.sleep(interval_s)
            self.interrupt()
            shot = self._grab(monitor=self.monitor, region=self.region)
            if shot.content_hash == last.content_hash:
                last = shot
                break
            last = shot
        self._settled = last

    # --- acting ---------------------------------------------------------------------------------------

    def _safe(self, px: int, py: int) -> tuple[int, int]:
        """Move a target off the fail-safe corners by one pixel, towards the screen's inside."""
        corners = getattr(self.input, "FAILSAFE_POINTS", [])
        if (px, py) in corners:
            width, height = self.input.size()
            px = px + 1 if px <= 0 else px - 1 if px >= width - 1 else px
            py = py + 1 if py <= 0 else py - 1 if py >= height - 1 else py
        return px, py

    def _point(self, x: float, y: float, shot: Screenshot) -> tuple[int, int]:
        """Where the pointer goes, in the input backend's coordinates."""
        px, py = to_pixels(x, y, shot)
        if self.platform == "darwin" and shot.scale > 0 and shot.scale != 1:
            # mss captures physical pixels, but pyautogui on macOS moves in logical points (Retina: 2 px each)
            px, py = round(px / shot.scale), round(py / shot.scale)
        return self._safe(px, py)

    def _one_character(self, keys: tuple[str, ...]) -> str:
        """The character when `keys` is one printable character that X11 types by its own keysym (a
        lone "<" pressed through pyautogui's X11 table would arrive as ">"), else ""."""
        if isinstance(self.input, X11Input) and len(keys) == 1 and len(keys[0]) == 1:
            return keys[0] if keys[0].isprintable() and self.input.can_type(keys[0]) else ""
        return ""

    def _keys(self, keys: tuple[str, ...]) -> list[str]:
        if self._one_character(keys):
            return list(keys)
        names = [key_name(k, self.platform) for k in keys]
        valid = getattr(self.input, "isValidKey", lambda k: True)
        unknown = [k for k, n in zip(keys, names, strict=True) if not valid(n)]
        if unknown:
            raise ActionError(
                f"Unknown key {unknown[0]!r}; use names like enter, esc, tab, ctrl, alt, shift, up, f5 or a letter."
            )
        return names

    def _check_text(self, text: str) -> None:
        x11 = isinstance(self.input, X11Input)
        valid = self.input.can_type if x11 else getattr(self.input, "isValidKey", lambda k: True)
        missing = sorted({c for c in text if not valid(c)})
        if missing:
            raise ActionError(f"Cannot type {''.join(missing)!r} with this keyboard; type plain ASCII text instead.")

    def validate(self, action: A.Action) -> None:
        """ActionError when this keyboard cannot press or type what `action` asks; the dry run asks too."""
        if isinstance(action, A.Key):
            self._keys(action.keys)
        elif isinstance(action, A.Type):
            self._check_text(action.text)

    def _type(self, text: str) -> int:
        """Type `text` one character at a time; the number of characters typed."""
        self._check_text(text)
        typed = 0
        with self.input.typing() if isinstance(self.input, X11Input) else nullcontext():
            for char in text:
                self.interrupt()  # a long text must not outlive the emergency stop
                try:
                    self.input.write(char)
                except ActionError as exc:
                    raise ActionError(f"{exc} Typed {typed} of {len(text)} characters before that.") from None
                typed += 1
        return typed

    def execute(self, action: A.Action, shot: Screenshot) -> ActionResult:
        pg = self.input
        try:
            return self._execute(pg, action, shot)
        except EmergencyStop:
            raise
        except Exception as exc:
            if type(exc).__name__ == "FailSafeException":
                raise EmergencyStop(
                    "The pointer was pushed into a screen corner, which stops the run (pyautogui fail-safe)."
                ) from None
            if isinstance(exc, ActionError):
                raise
            raise ActionError(f"{A.describe(action)} failed: {exc}.") from None

    def _execute(self, pg, action: A.Action, shot: Screenshot) -> ActionResult:
        if isinstance(action, A.Key | A.Type):
            time.sleep(max(0.0, self._clicked_at + CLICK_TO_KEYS_S - time.monotonic()))
        result = self._act(pg, action, shot)
        if isinstance(action, (*A.POINTER_ACTIONS, A.LeftClickDrag)) and not isinstance(action, A.MouseMove):
            self._clicked_at = time.monotonic()
        return result

    def _act(self, pg, action: A.Action, shot: Screenshot) -> ActionResult:
        buttons = {A.LeftClick: "left", A.RightClick: "right", A.MiddleClick: "middle"}
        if isinstance(action, A.MouseMove):
            px, py = self._point(action.x, action.y, shot)
            pg.moveTo(px, py)
            return ActionResult(True, "moved the pointer there", {"pixels": [[px, py]]})
        if type(action) in buttons:
            px, py = self._point(action.x, action.y, shot)
            pg.click(px, py, button=buttons[type(action)])
            return ActionResult(True, "clicked", {"pixels": [[px, py]]})
        if isinstance(action, A.DoubleClick | A.TripleClick):
            px, py = self._point(action.x, action.y, shot)
            count = 2 if isinstance(action, A.DoubleClick) else 3
            pg.click(px, py, clicks=count, interval=0.02, button="left")
            return ActionResult(True, f"clicked {count} times", {"pixels": [[px, py]]})
        if isinstance(action, A.LeftClickDrag):
            if action.start_x is not None and action.start_y is not None:
                sx, sy = self._point(action.start_x, action.start_y, shot)
                pg.moveTo(sx, sy)
            else:
                sx, sy = pg.position()
            px, py = self._point(action.x, action.y, shot)
            pg.mouseDown(button="left")
            try:
                pg.moveTo(px, py, duration=DRAG_S)
            finally:
                pg.mouseUp(button="left")
            return ActionResult(True, "dragged", {"pixels": [[sx, sy], [px, py]]})
        if isinstance(action, A.Key):
            names = self._keys(action.keys)
            if self._one_character(action.keys):
                self._type(names[0])
            else:
                pg.hotkey(*names)
            return ActionResult(True, f"pressed {'+'.join(names)}", {"keys": names})
        if isinstance(action, A.Type):
            typed = self._type(action.text)
            return ActionResult(True, f"typed {typed} character{'s' * (typed != 1)}", {"text": action.text})
        if isinstance(action, A.Scroll | A.HScroll):
            clicks = int(max(-MAX_SCROLL_CLICKS, min(MAX_SCROLL_CLICKS, round(action.pixels))))
            detail: dict = {"clicks": clicks}
            where = ()
            if action.x is not None and action.y is not None:
                where = self._point(action.x, action.y, shot)
                detail["pixels"] = [list(where)]
            (pg.scroll if isinstance(action, A.Scroll) else pg.hscroll)(clicks, *where)
            return ActionResult(True, f"scrolled {clicks} wheel clicks", detail)
        # wait, terminate and answer never get here: the agent sleeps on the stop switch or ends the run
        return ActionResult(True, A.describe(action))

    def close(self) -> None:
        """Nothing stays held (a drag releases its button even when it fails); keys lent to the keyboard
        map for characters it lacked are given back."""
        if isinstance(self._input, X11Input):
            self._input.restore_keymap()
