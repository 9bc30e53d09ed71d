"""The compile cache between starts, on the CPU: one folder per GPU model and torch build, a key below it;
a cache that cannot be read is set aside with one sentence and never stops a start; what a warm-up saves
loads in a fresh process; `qvl-agent warm-up` without a GPU says there is nothing to compile, exit 0; and
start to ready with the cache cold and warm runs in fresh processes (compile off on a CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qvl_agent.devtools.bench import start_times_line
from qvl_agent.engine.compile_cache import (
    ARTIFACTS,
    MANIFEST,
    cache_dir,
    load_artifacts,
    machine_tag,
    use_cache_dir,
)
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "qvl-agent" / "compile"


@pytest.mark.parametrize(
    "gpu, torch_version, tag",
    [
        ("NVIDIA H100 80GB HBM3", "2.14.1+cu130", "nvidia-h100-80gb-hbm3-torch2.14.1-cu130"),
        ("NVIDIA H200", "2.11.0", "nvidia-h200-torch2.11.0"),
        ("NVIDIA GeForce RTX 4090/PCIe/SSE2", "2.14.1", "nvidia-geforce-rtx-4090-pcie-sse2-torch2.14.1"),
    ],
)
def test_the_folder_is_per_gpu_model_and_torch_build(gpu, torch_version, tag):
    assert machine_tag(gpu, torch_version) == tag
    assert cache_dir("abc123", gpu, torch_version).parts[-2:] == (tag, "abc123")


def test_the_engine_compiles_into_its_gpus_folder(cache_home, monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # use_cache_dir sets TORCHINDUCTOR_CACHE_DIR
    folder = use_cache_dir("abc123", "NVIDIA H200", "2.14.1")
    assert Path(folder) == cache_home / "nvidia-h200-torch2.14.1" / "abc123" and Path(folder).is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder


@pytest.mark.parametrize("broken", [ARTIFACTS, MANIFEST])
def test_an_unreadable_cache_is_set_aside_with_one_sentence_and_the_start_goes_on(cache_home, monkeypatch, broken):
    monkeypatch.setattr(os, "environ", dict(os.environ))
    folder = cache_home / "nvidia-h200-torch2.14.1" / "abc123"
    folder.mkdir(parents=True)
    (folder / "kernel.py").write_text("# inductor's own file\n")
    (folder / broken).write_bytes(b"\x00not what was written\xff")
    said: list[str] = []
    assert use_cache_dir("abc123", "NVIDIA H200", "2.14.1", notify=said.append) == str(folder)
    assert len(said) == 1 and "could not be read" in said[0] and "\n" not in said[0]
    assert list(folder.iterdir()) == []  # a fresh folder for the cold compile
    aside = [p for p in folder.parent.iterdir() if p.name.startswith("abc123.unreadable-")]
    assert len(aside) == 1 and (aside[0] / "kernel.py").exists()  # kept for a look, out of the way
    assert aside[0].name in said[0]
    # The next start finds the fresh folder and says nothing.
    assert load_artifacts(folder, notify=said.append) is False and len(said) == 1


def test_a_folder_without_a_warm_up_loads_quietly(tmp_path):
    said: list[str] = []
    assert load_artifacts(tmp_path, notify=said.append) is False and said == []


@pytest.mark.slow
def test_what_a_warm_up_saves_loads_in_a_fresh_process(tmp_path):
    """torch.compile on the CPU (inductor's C++ backend) stands in for the GPU's compiled step."""
    folder = tmp_path / "warm"
    folder.mkdir()
    compile_and_save = (
        "import sys, torch; from pathlib import Path; from qvl_agent.engine.compile_cache import save_artifacts\n"
        "f = torch.compile(lambda x: (x.sin() * 2).sum(), dynamic=False); f(torch.randn(8))\n"
        "print(save_artifacts(Path(sys.argv[1]), {'model': 'test'}))"
    )
    load = (
        "import sys; from pathlib import Path; from qvl_agent.engine.compile_cache import load_artifacts\n"
        "print(load_artifacts(Path(sys.argv[1]), notify=lambda m: print('NOTICE', m)))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-1"))
    saved = subprocess.run(
        [sys.executable, "-c", compile_and_save, str(folder)], env=env, capture_output=True, text=True
    )
    assert saved.returncode == 0, saved.stderr[-2000:]
    assert int(saved.stdout.split()[-1]) == (folder / ARTIFACTS).stat().st_size > 0
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["model"] == "test" and manifest["bytes"] > 0 and manifest["torch"]
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-2")  # another machine's empty cache
    loaded = subprocess.run([sys.executable, "-c", load, str(folder)], env=env, capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.split() == ["True"], loaded.stdout + loaded.stderr[-2000:]


def test_warm_up_without_a_gpu_says_there_is_nothing_to_compile(tiny_model_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: warm-up would compile")
    env = {"QVL_CONFIG_DIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for device in ("auto", "cpu"):
        r = run_cli("warm-up", "--model", str(tiny_model_dir), "--device", device, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Nothing to compile:") and "GPU" in lines[0]
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "cache" / "qvl-agent" / "compile").exists()  # nothing written


def test_warm_up_of_a_remote_engine_is_a_usage_error(tmp_path):
    r = run_cli("warm-up", "--engine", "openai:http://127.0.0.1:9", env={"QVL_CONFIG_DIR": str(tmp_path)})
    assert r.returncode == 2 and "nothing to compile" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_start_to_ready_runs_cold_and_warm_in_fresh_processes(tiny_model_dir):
    from qvl_agent.devtools.ready import start_times

    cold, warm = start_times(str(tiny_model_dir), "cpu")
    for run in (cold, warm):
        assert run["ready_s"] > 0 and run["compile_s"] is None and run["decode_path"] == "eager"
        assert run["cache_folder"] is None  # nothing compiled, nothing saved
    line = start_times_line({"cold": cold, "warm": warm})
    assert line.startswith("(e) start to ready in a fresh process: cold compile cache ")
    assert "warm compile cache" in line and "nothing to compile" in line
    gpu = {"ready_s": 15.5, "compile_s": 10.6}
    assert "cold compile cache 26.8 s + compile 163.0 s; warm compile cache 15.5 s + compile 10.6 s" in (
        start_times_line({"cold": {"ready_s": 26.8, "compile_s": 163.0}, "warm": gpu})
    )
