"""Start to ready with the compile cache cold and warm, each start in a fresh process, and the warm-up that
fills the cache (`qvl-agent warm-up`).

`warm(settings)` loads the engine, waits for the compiled decode step and saves torch's cache artifacts
into the cache folder (`engine/compile_cache.py`). `start_times` runs that in two child processes over one
empty cache folder: the first start compiles cold and leaves the cache, the second starts from it. On a
CPU there is nothing to compile: both starts load and warm up the engine eagerly, so the path runs (and
is tested) without a GPU, and their compile figures are None.

    python -m qvl_agent.devtools.ready MODEL DEVICE   (the child: one JSON line on stdout)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from qvl_agent.config import Settings


def warm(settings: Settings, log: Callable[[str], None] = lambda _: None) -> dict:
    """Load the local engine with compilation on, wait for the compiled step and keep its cache. Returns
    `ready_s` (load + warm-up), `compile_s` (the background build after ready; None when nothing
    compiles), `decode_path`, `gpu`, and where the cache went (`cache_folder`, `cache_bytes`)."""
    from qvl_agent.engine import open_engine
    from qvl_agent.engine.compile_cache import save_artifacts

    t0 = time.perf_counter()
    engine = open_engine(replace(settings, compile=True))
    ready_s = time.perf_counter() - t0
    log(f"engine ready in {ready_s:.1f} s")
    try:
        result = {"ready_s": round(ready_s, 2), "compile_s": None, "gpu": None, "cache_folder": None, "cache_bytes": 0}
        if engine.compiler is not None:
            import torch

            engine.wait_compiled()
            result["compile_s"] = round(engine.compiler.seconds, 2)
            result["gpu"] = torch.cuda.get_device_name(engine.device)
            if not engine.compiler.error:
                folder = Path(engine.compiler.cache_folder)
                about = {"model": settings.model, "gpu": result["gpu"], "ready_s": result["ready_s"]}
                result["cache_bytes"] = save_artifacts(folder, {**about, "compile_s": result["compile_s"]})
                result["cache_folder"] = str(folder)
        result["decode_path"] = engine.compile_status
        result["why_not_compiled"] = engine.fast_problem
        return result
    finally:
        engine.close()


def start_times(model: str, device: str, log: Callable[[str], None] = lambda _: None) -> tuple[dict, dict]:
    """(cold, warm): `warm` in two fresh processes over one empty compile-cache folder."""
    with tempfile.TemporaryDirectory(prefix="qvl-compile-cache-") as cache:
        runs = []
        for which in ("cold", "warm"):
            runs.append(_child(model, device, cache))
            log(f"start to ready, compile cache {which}: {runs[-1]['ready_s']} s, compile {runs[-1]['compile_s']} s")
        return runs[0], runs[1]


def _child(model: str, device: str, cache: str) -> dict:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "qvl_agent.devtools.ready", model, device],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"a start-to-ready run failed (exit {proc.returncode}): {' / '.join(tail)}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    model, device = (argv if argv is not None else sys.argv[1:])[:2]
    print(json.dumps(warm(Settings(model=model, device=device))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
