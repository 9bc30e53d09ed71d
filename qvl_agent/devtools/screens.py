"""Desktop-like test screens for the benchmarks: numpy only, so a load generator that only sends them
(`scripts/serve_bench.py`) starts without torch."""

from __future__ import annotations

import numpy as np

from qvl_agent.image import Screenshot


def ui_screenshot(seed: int, width: int = 1920, height: int = 1080) -> Screenshot:
    """A BGRA screenshot that looks like a desktop: panels, buttons, text-like strokes. `seed` moves
    things around so each one is a different screen to the feature cache."""
    rng = np.random.default_rng(seed)
    img = np.full((height, width, 4), 236, np.uint8)
    img[..., 3] = 0
    img[:40] = (60, 48, 40, 0)  # title bar
    for _ in range(14):  # panels and buttons
        x, y = int(rng.integers(0, width - 300)), int(rng.integers(40, height - 120))
        w, h = int(rng.integers(80, 300)), int(rng.integers(24, 120))
        img[y : y + h, x : x + w, :3] = rng.integers(90, 250, 3)
    for row in range(60, height, 22):  # lines of "text"
        for x in range(int(rng.integers(10, 60)), width - 40, int(rng.integers(9, 14))):
            if rng.random() < 0.7:
                img[row : row + 10, x : x + 6, :3] = rng.integers(10, 80)
    return Screenshot(img.tobytes(), width, height, "BGRA", source=f"bench-{seed}")
