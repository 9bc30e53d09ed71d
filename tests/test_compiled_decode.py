"""The background switch to a compiled decode step, on CPU with the tiny model: a stand-in builder (the
same eager step, counted) proves the swap waits for the engine's lock, happens between turns and leaves
every reply identical; the on-disk compile cache is keyed by what the compiled code depends on. The
compiled CUDA step itself is checked on a GPU by `scripts/gpu_check.py`."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from qvl_agent.config import load
from qvl_agent.engine.base import GenerationOptions
from qvl_agent.engine.compiled_decode import BackgroundSwap, cache_key, use_cache_dir
from qvl_agent.engine.qwen3vl import Qwen3VLEngine
from tests.test_engine_local import _shot

OPTS = GenerationOptions(max_new_tokens=10, min_new_tokens=10)


@pytest.fixture
def engine(tiny_model_dir):
    return Qwen3VLEngine.load(str(tiny_model_dir), device="cpu")


def counted_swap(engine, log: dict, fail: bool = False):
    """A builder whose "compiled" step is the engine's own eager forward, counted; it records whether
    it was installed while holding the engine's lock."""
    prepared = threading.Event()
    log["prepared"] = prepared

    def prepare(item):
        prepared.set()
        if fail:
            raise RuntimeError("inductor is not available")
        original = engine.forward

        def step(*args, **kwargs):
            log["calls"] += 1
            return original(*args, **kwargs)

        return step

    def install(item, step):
        log["under_lock"] = engine.lock._holder == threading.get_ident()
        engine.forward = step

    log["calls"] = 0
    return lambda e: BackgroundSwap(e.lock, ["decode"], prepare, install)


def test_on_a_cpu_decoding_stays_eager_and_says_so(engine):
    session = engine.open_session([_shot(320, 240, 3)])
    session.complete("What is here?", options=OPTS)
    assert engine.compiler is None
    assert engine.compile_status == "eager"
    assert session.last_stats.decode_path == "eager"


def test_the_swap_waits_for_the_turn_in_progress_and_replies_stay_identical(engine):
    shot = _shot(320, 240, 5)
    reference = engine.open_session([shot])
    expected = [reference.complete(q, options=OPTS) for q in ("Describe it.", "And then?")]

    session = engine.open_session([shot])
    stream = session.ask("Describe it.", options=OPTS)
    first = next(stream)  # the turn now holds the engine's lock
    log: dict = {}
    engine.start_compile(counted_swap(engine, log))
    assert log["prepared"].wait(60)
    assert engine.compile_status == "compiling 0/1"  # prepared, but not installed during a turn
    assert log["calls"] == 0
    reply = first + "".join(stream)
    assert engine.wait_compiled(60)
    assert log["under_lock"] is True
    assert engine.compile_status == "compiled"
    assert reply == expected[0]
    assert session.complete("And then?", options=OPTS) == expected[1]
    assert log["calls"] > 0  # the follow-up ran on the swapped-in step
    assert session.last_stats.decode_path == "compiled"
    again = engine.open_session([shot])
    assert [again.complete(q, options=OPTS) for q in ("Describe it.", "And then?")] == expected


def test_a_failed_build_keeps_the_current_path_and_says_why(engine):
    shot = _shot(320, 240, 7)
    expected = engine.open_session([shot]).complete("Describe it.", options=OPTS)
    log: dict = {}
    engine.start_compile(counted_swap(engine, log, fail=True))
    assert engine.wait_compiled(60) is False
    assert engine.compile_status.startswith("eager (compile failed after 0/1")
    assert "inductor is not available" in engine.compile_status
    session = engine.open_session([shot])
    assert session.complete("Describe it.", options=OPTS) == expected
    assert log["calls"] == 0


def test_the_compile_cache_is_keyed_by_model_config_shapes_torch_gpu_and_dtype(tiny_model_dir, tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir).to_dict()
    shapes, torch_version, gpu, dtype = (4096, 512, 1024, 2048, 4096), "2.14.1", "NVIDIA H200", "torch.bfloat16"
    key = cache_key(config, shapes, torch_version, gpu, dtype)
    # The same model from another folder compiles to the same code: its cache is shared.
    moved = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, moved)
    assert cache_key(AutoConfig.from_pretrained(moved).to_dict(), shapes, torch_version, gpu, dtype) == key
    deeper = AutoConfig.from_pretrained(tiny_model_dir)
    deeper.text_config.num_hidden_layers += 1
    others = [
        cache_key(deeper.to_dict(), shapes, torch_version, gpu, dtype),
        cache_key(config, (8192, 512, 1024, 2048, 4096, 8192), torch_version, gpu, dtype),
        cache_key(config, shapes, "2.15.0", gpu, dtype),
        cache_key(config, shapes, torch_version, "NVIDIA GeForce RTX 4090", dtype),
        cache_key(config, shapes, torch_version, gpu, "torch.float16"),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_the_compile_cache_folder_is_the_persons_when_they_chose_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    chosen = use_cache_dir("abc123")
    assert chosen.startswith(str(tmp_path / "cache")) and chosen.endswith("abc123")
    assert os.path.isdir(chosen)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # torch's own default, set by torch
    assert use_cache_dir("abc123") == chosen
    mine = tmp_path / "mine"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    assert use_cache_dir("def456") == str(mine)
    assert not (tmp_path / "cache" / "qvl-agent" / "compile" / "def456").exists()


def test_compile_can_be_turned_off_in_settings():
    assert load(env={"QVL_CONFIG_DIR": "/nonexistent-qvl"}).settings.compile is True
    assert load(env={"QVL_COMPILE": "0", "QVL_CONFIG_DIR": "/nonexistent-qvl"}).settings.compile is False
