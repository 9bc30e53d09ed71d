"""Model coordinates (0-1000) <-> physical pixels, tested with tables over a mocked monitor list."""

from __future__ import annotations

import pytest

from qvl_agent.capture import monitor_at
from qvl_agent.errors import OffScreenError
from qvl_agent.image import Region, Screenshot, to_model, to_pixels

# What mss reports on a desk with two monitors: index 0 is the union, then each monitor.
# Monitor 1: 1920x1080 at scale 1, primary. Monitor 2: a HiDPI panel LEFT of it, at a negative offset,
# 2560x1440 logical at 2x = 5120x2880 physical pixels (X11, mss and pyautogui all work in physical pixels).
MONITORS = [
    Region(-5120, -1800, 7040, 2880),
    Region(0, 0, 1920, 1080),
    Region(-5120, -1800, 5120, 2880),
]
SCALES = {1: 1.0, 2: 2.0}


def shot_of(index: int) -> Screenshot:
    """A screenshot as capture.grab builds it for monitor `index`, without a display."""
    m = MONITORS[index]
    return Screenshot(
        b"\0" * (m.width * m.height * 4),
        m.width,
        m.height,
        "BGRA",
        left=m.left,
        top=m.top,
        scale=SCALES.get(index, 1.0),
        monitor=index,
    )


def region_shot(left: int, top: int, width: int, height: int) -> Screenshot:
    return Screenshot(b"\0" * (width * height * 4), width, height, "BGRA", left=left, top=top)


MONITOR_CASES = [
    # monitor, model point, physical pixel
    (1, (0, 0), (0, 0)),
    (1, (500, 500), (960, 540)),
    (1, (1000, 1000), (1919, 1079)),  # the far edge is clamped to the last pixel
    (1, (999.9, 999.9), (1919, 1079)),
    (1, (250, 750), (480, 810)),
    (1, (0.4, 0.4), (0, 0)),
    (2, (0, 0), (-5120, -1800)),  # negative offset
    (2, (500, 500), (-2560, -360)),
    (2, (1000, 1000), (-1, 1079)),  # last pixel of the left monitor, one left of the primary's origin
    (2, (100, 900), (-4608, 792)),
    (0, (500, 500), (-1600, -360)),  # the whole desktop as one image
    (0, (1000, 0), (1919, -1800)),
]


@pytest.mark.parametrize(("index", "point", "pixel"), MONITOR_CASES)
def test_model_point_to_physical_pixel(index, point, pixel):
    shot = shot_of(index)
    assert to_pixels(*point, shot) == pixel
    # The pixel lies on the monitor the model was looking at.
    if index:
        assert monitor_at(*pixel, MONITORS) == index


def test_hidpi_monitor_uses_physical_pixels():
    # The model saw 5120 physical pixels across; its 0-1000 grid spans all of them, whatever the scale.
    hidpi = shot_of(2)
    assert hidpi.scale == 2.0
    assert to_pixels(10, 10, hidpi) == (-5120 + 51, -1800 + 28)
    # The same relative point on the 1x monitor lands at the same relative place.
    assert to_pixels(10, 10, shot_of(1)) == (19, 10)


REGION_CASES = [
    # region (left, top, width, height), model point, pixel
    ((100, 200, 800, 600), (0, 0), (100, 200)),
    ((100, 200, 800, 600), (500, 500), (500, 500)),
    ((100, 200, 800, 600), (1000, 1000), (899, 799)),
    ((-300, -50, 300, 100), (500, 500), (-150, 0)),
    ((7, 9, 1, 1), (1000, 0), (7, 9)),  # a one-pixel region
    ((0, 0, 1000, 1000), (123, 456), (123, 456)),  # the grid maps 1:1 onto a 1000-pixel square
]


@pytest.mark.parametrize(("region", "point", "pixel"), REGION_CASES)
def test_model_point_to_region_pixel(region, point, pixel):
    assert to_pixels(*point, region_shot(*region)) == pixel


OFF_SCREEN = [(-1, 500), (500, -0.01), (1000.5, 10), (10, 1001), (float("nan"), 3), (float("inf"), 3)]


@pytest.mark.parametrize("point", OFF_SCREEN)
def test_points_off_the_grid_are_refused(point):
    with pytest.raises(OffScreenError, match="off the screen"):
        to_pixels(*point, shot_of(1))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_every_pixel_round_trips(index):
    shot = shot_of(index)
    xs = [shot.left, shot.left + 1, shot.left + shot.width // 3, shot.left + shot.width - 1]
    ys = [shot.top, shot.top + shot.height // 2, shot.top + shot.height - 1]
    for px in xs:
        for py in ys:
            mx, my = to_model(px, py, shot)
            assert 0 <= mx <= 1000 and 0 <= my <= 1000
            assert to_pixels(mx, my, shot) == (px, py)


def test_whole_number_model_points_land_within_one_grid_step():
    # The model writes integers: rounding to_model's answer may move the pixel by at most width/1000.
    shot = shot_of(1)
    for px, py in [(0, 0), (959, 539), (1919, 1079), (1234, 77)]:
        mx, my = to_model(px, py, shot)
        rx, ry = to_pixels(min(round(mx), 1000), min(round(my), 1000), shot)
        assert abs(rx - px) <= 2 and abs(ry - py) <= 2


@pytest.mark.parametrize(("pixel", "index"), [((1920, 0), 1), ((-1, 0), 1), ((0, -1801), 2), ((0, 0), 2)])
def test_pixels_outside_the_capture_are_refused(pixel, index):
    with pytest.raises(OffScreenError, match="outside the captured area"):
        to_model(*pixel, shot_of(index))


class _Pointer:
    """The few pyautogui functions a click needs; records where the pointer was sent."""

    FAILSAFE_POINTS = [(0, 0)]

    def __init__(self):
        self.clicks: list[tuple[int, int]] = []

    def size(self):
        return (1440, 900)

    def click(self, x, y, button="left"):
        self.clicks.append((x, y))


@pytest.mark.parametrize(("platform", "target"), [("darwin", (720, 450)), ("linux", (1440, 900))])
def test_macos_pointer_moves_in_logical_points_on_a_retina_screen(platform, target):
    from qvl_agent import actions as A
    from qvl_agent.act.desktop import DesktopExecutor

    # A Retina panel: 2880x1800 physical pixels captured, 1440x900 points for pyautogui on macOS.
    retina = Screenshot(b"\0" * (2880 * 1800 * 4), 2880, 1800, "BGRA", scale=2.0, monitor=1)
    pointer = _Pointer()
    executor = DesktopExecutor(input_backend=pointer, platform=platform)
    executor.execute(A.LeftClick(500, 500), retina)
    assert pointer.clicks == [target]
