"""The resident local engine: Qwen3-VL on transformers, loaded once and kept warm.

What it does beyond `generate`:
- preprocessing in torch on the model's device from raw capture bytes (`preprocess.py`);
- vision features cached by a hash of what the model sees and fed back through `mm_encoder_outputs`
  (never an `inputs_embeds`-only path, which would silently drop DeepStack);
- per-session KV reuse: a follow-up prefills only its new tokens, token-exactly (generated ids are
  kept, never re-tokenized) with explicit 3-row M-RoPE position ids (no hidden `rope_deltas` state);
- its own decode loop, so tokens stream as they are chosen and a turn can be cancelled between tokens.

What it does not know: where images come from, prompts for agents, HTTP. One generation runs at a
time (`self.lock`); sessions are isolated and idle ones lose their KV cache under a memory cap.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence

import torch

from qvl_agent.config import Settings, download_command
from qvl_agent.engine.base import Engine, GenerationOptions
from qvl_agent.engine.batch_kv import BatchKV, free_bytes, row_layout
from qvl_agent.engine.batcher import Batcher
from qvl_agent.engine.context import Context, ImageSpan
from qvl_agent.engine.cuda_graphs import GraphRunner, KVSlot, vision_kwargs
from qvl_agent.engine.fast_step import fuse_weights
from qvl_agent.engine.fast_step import supported as fast_step_supported
from qvl_agent.engine.feature_cache import FeatureCache, Features, feature_key
from qvl_agent.engine.kv_state import TurnLock
from qvl_agent.engine.local_session import LocalSession
from qvl_agent.engine.model_dir import local_source
from qvl_agent.engine.preprocess import PreprocessSettings, grid_for, preprocess
from qvl_agent.engine.speculate import skeleton_ids
from qvl_agent.errors import EngineError, ModelNotFoundError
from qvl_agent.image import Screenshot

# Tokens the GPU's static KV slot holds: the longest conversation that decodes through CUDA graphs
# (112 KiB a token on the 2B model: 1.75 GiB). Longer ones still run, on the eager path.
SLOT_TOKENS = 16_384
# Eager prefills run this many tokens at a time and check for a cancel in between, so a client that hangs
# up during a long prompt frees the engine within one chunk: ~100 ms on a GPU, where one pass over a 4K
# screenshot's 8k-token prompt is faster than chunks of it; a CPU needs seconds for 1k tokens of the 2B.
PREFILL_CHUNK = {"cuda": 8192}
PREFILL_CHUNK_OTHER = 1024
# Greedy tokens decoded per host round trip when no draft is proposed: one graph replay runs this many
# steps, each fed the previous one's choice on the device, and one sync brings them back. Up to k-1 steps
# past an end token or a stop string are wasted (and trimmed from the KV); a cancel waits for at most k.
DECODE_STEPS = 8


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"Device {device} was asked for, but this machine has no usable CUDA GPU.")
    return torch.device(device)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """A quick connect to the Hugging Face endpoint, so that a machine without network gets its answer
    in seconds instead of minutes of download retries."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _in_cache(model_id: str) -> bool:
    """Whether the Hugging Face cache holds `model_id`'s config.json (without which nothing loads); True
    when the id is not one the hub's cache can name, so that the loader's own error says what is wrong."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except ValueError:
        return True


def _load_pretrained(model_id: str, dtype: torch.dtype):
    """Model and processor from a directory or the Hugging Face cache, one readable error otherwise."""
    source, is_dir = local_source(model_id)
    # The local cache first, then the network when there is one.
    attempts = [True] if is_dir else [True, False] if _hub_reachable() else [True]
    if not is_dir and attempts == [True] and not _in_cache(model_id):
        raise _not_downloaded(model_id)  # said before transformers is imported, which takes seconds

    from huggingface_hub.utils import logging as hub_logging
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr belongs to --stats and to our own messages
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    last: Exception | None = None
    for local_only in attempts:
        try:
            processor = AutoProcessor.from_pretrained(source, local_files_only=local_only)
            model = Qwen3VLForConditionalGeneration.from_pretrained(
                source, dtype=dtype, attn_implementation="sdpa", local_files_only=local_only
            )
            return model, processor
        except (OSError, ValueError) as exc:
            last = exc
    if is_dir:
        raise EngineError(f"{model_id} could not be loaded as a Qwen3-VL model ({last}).")
    raise _not_downloaded(model_id)


def _not_downloaded(model_id: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"The model {model_id} is not in the Hugging Face cache and could not be downloaded; "
        f"download it where there is network ({download_command(model_id)}) and pass --model DIR or set QVL_MODEL=DIR."
    )


class Qwen3VLEngine(Engine):
    writes_reply_prefix = True  # as forced tokens (`LocalSession`)

    def __init__(self, model, processor, name: str = "qwen3-vl", settings: Settings | None = None):
        self.settings = settings or Settings()
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        cfg = model.config
        self.image_token_id = cfg.image_token_id
        self.image_token = processor.image_token
        self.merge = cfg.vision_config.spatial_merge_size
        self.pp = PreprocessSettings.from_processor(processor.image_processor, self.settings.max_pixels)
        self.identity = f"{name}|{self.dtype}|{self.device}"
        self.features = FeatureCache(self.settings.feature_cache_mb * 2**20)
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        }
        self.im_end = "<|im_end|>"
        self.im_end_id = self.tokenizer.convert_tokens_to_ids(self.im_end)
        self.eos_list = sorted(self.eos_ids)
        self.skeletons = skeleton_ids(self.tokenizer)
        self.speculative = bool(self.settings.speculative)
        self.prefill_chunk = PREFILL_CHUNK.get(self.device.type, PREFILL_CHUNK_OTHER)
        # Vision placeholders are the processor's to place: a random or confused model that emits one
        # would leave a context with more placeholders than images. Never sample them.
        vision_ids = [
            cfg.image_token_id,
            cfg.video_token_id,
            cfg.vision_start_token_id,
            cfg.vision_end_token_id,
        ]
        self.banned_ids = torch.tensor(vision_ids, device=self.device)
        self.lock = TurnLock()  # one turn at a time, held across a turn's yields; refuses re-entry
        self._sessions: weakref.WeakValueDictionary[str, LocalSession] = weakref.WeakValueDictionary()
        self._sessions_lock = threading.Lock()  # sessions open on any thread while the batch thread reads them
        self.vision_runs = 0  # how many times the vision tower ran (tests check reuse with it)
        self._vision_inputs: dict[tuple, dict] = {}  # grid -> precomputed vision-tower inputs
        self.fast: GraphRunner | None = None  # CUDA graphs, set up by warm_up() on a GPU
        self.fast_problem = ""  # why the graphs are off, when they are
        self.compiler = None  # the background build of the compiled decode step (`compiled_decode.py`)
        self.step_weights = None  # fused per-layer weights of the hand-written decode step (`fast_step.py`)
        self.decode_steps = DECODE_STEPS
        self.batcher: Batcher | None = None  # continuous batching of concurrent turns, set up by warm_up()

    def warm_up(self, slot_tokens: int = SLOT_TOKENS) -> None:
        """Capture the CUDA graphs and run one small turn, so the first real request pays no set-up.
        On a CPU only the turn runs. A GPU path that cannot be captured falls back to eager, and
        `fast_problem` says why."""
        if self.device.type == "cuda" and self.fast is None:
            self.fused_weights()  # before any capture: fusing replaces the weight tensors that graphs read
            try:
                slot = KVSlot(self.model, slot_tokens, self.device, self.dtype)
                runner = GraphRunner(self.model, slot)
                runner.capture()
                self.fast = runner
            except Exception as exc:  # any capture failure: stay correct on the eager path
                self.fast_problem = f"{type(exc).__name__}: {exc}"
                self.fast = None
            if self.fast is not None and self.fast.problem:
                self.fast_problem = self.fast.problem
        if self.batcher is None:
            self.start_batching(self.settings.max_batch, self.settings.batch_memory_mb)
        blank = Screenshot(bytes(256 * 256 * 3), 256, 256, "RGB", source="warm-up")
        session = self.open_session([blank])
        session.complete("Hi", options=GenerationOptions(max_new_tokens=2, min_new_tokens=2))
        session.close()
        if self.fast is not None and self.settings.compile:
            self.start_compile()

    def start_batching(self, max_batch: int, memory_mb: int) -> None:
        """Let turns of different sessions that overlap decode in one batched step (`batcher.py`): as
        many rows as `max_batch`, `memory_mb` of KV and half the free memory allow (the rest stays for
        activations, vision features and sessions' own caches), with rows as long as that leaves room for
        (`batch_kv.row_layout`). Fewer than two: batching stays off."""
        memory = min(memory_mb * 2**20, free_bytes(self.device) // 2)
        rows, row_tokens = row_layout(max_batch, memory, BatchKV.bytes_per_token(self.model, self.dtype))
        if rows >= 2 and self.fused_weights() is not None:  # the batched step is the fused one, for n rows
            self.batcher = Batcher(self, rows, row_tokens)

    def fused_weights(self):
        """The per-layer weights of the fused decode steps (`fast_step.fuse_weights`), fused on first
        use; None for a model those steps do not compute exactly (`fast_step.supported`)."""
        if self.step_weights is None and not fast_step_supported(self.model):
            self.step_weights = fuse_weights(self.model)
        return self.step_weights

    def start_compile(self, make_swap=None) -> None:
        """Build the compiled decode step on a background thread and swap it in between turns; serving
        goes on over the plain graphs meanwhile. `make_swap(engine)` returns the `BackgroundSwap` (the
        compiled CUDA step by default)."""
        from qvl_agent.engine.compiled_decode import compiled_decode_swap

        if self.compiler is None:
            self.compiler = (make_swap or compiled_decode_swap)(self).start()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Block until the compiled decode step is in (True) or cannot be (False)."""
        return self.compiler.wait(timeout) if self.compiler is not None else False

    @property
    def compile_status(self) -> str:
        """How decode steps run: "eager", "plain graphs", "compiling i/n" or "compiled"."""
        plain = "plain graphs" if self.fast is not None else "eager"
        if self.compiler is None:
            return plain
        status = self.compiler.status
        return f"{plain} ({status})" if self.compiler.error else status

    @classmethod
    def load(cls, model_id: str, device: str = "auto", settings: Settings | None = None) -> Qwen3VLEngine:
        dev = pick_device(device)
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        model, processor = _load_pretrained(model_id, dtype)
        engine = cls(model.to(dev), processor, name=model_id, settings=settings)
        engine.warm_up()
        return engine

    def open_session(self, images: Sequence[Screenshot] = (), system=None, tools=None) -> LocalSession:
        session = LocalSession(self, images, system, tools)
        with self._sessions_lock:
            self._sessions[session.id] = session
        return session

    def live_sessions(self) -> list[LocalSession]:
        with self._sessions_lock:
            return list(self._sessions.values())

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        for session in self.live_sessions():
            session.close()
        self.features.clear()

    # --- pieces of a turn -----------------------------------------------------------------------------

    def image_entry(self, shot: Screenshot) -> tuple[str, int, tuple[int, int, int]]:
        """(feature key, visual tokens, grid) without touching pixels beyond the content hash."""
        grid = grid_for(shot, self.pp)
        return (
            feature_key(shot.content_hash, self.pp, self.identity),
            grid[1] * grid[2] // self.merge**2,
            grid,
        )

    @torch.inference_mode()
    def encode_images(self, shots: list[tuple[Screenshot, str]]) -> tuple[list[Features], float, float, bool]:
        """Features for each (screenshot, key): from the cache, else preprocess + vision tower.
        Returns (features, preprocess_ms, vision_ms, ran_vision)."""
        out: list[Features] = []
        pre_ms = vis_ms = 0.0
        ran = False
        for shot, key in shots:
            feats = self.features.get(key)
            if feats is None:
                t0 = time.perf_counter()
                pixel_values, grid = preprocess(shot, self.pp, self.device)
                self._sync()
                t1 = time.perf_counter()
                vo = self.model.model.get_image_features(
                    pixel_values, grid, return_dict=True, **self._vision_kwargs(grid)
                )
                feats = Features(
                    vo.pooler_output[0],
                    tuple(level[0] for level in vo.deepstack_features),
                    tuple(grid[0].tolist()),
                )
                self._sync()
                pre_ms += (t1 - t0) * 1000
                vis_ms += (time.perf_counter() - t1) * 1000
                self.vision_runs += 1
                ran = True
                self.features.put(key, feats)
            out.append(feats)
        return out, pre_ms, vis_ms, ran

    def _vision_kwargs(self, grid: torch.Tensor) -> dict:
        key = tuple(grid.flatten().tolist())
        if key not in self._vision_inputs:
            if len(self._vision_inputs) >= 8:
                self._vision_inputs.pop(next(iter(self._vision_inputs)))
            self._vision_inputs[key] = vision_kwargs(grid, self.model.model.visual, self.model.config.vision_config)
        return dict(self._vision_inputs[key])  # the tower pops what it uses

    def positions(self, ctx: Context) -> torch.Tensor:
        """Explicit M-RoPE position ids `[3, 1, L]` for the whole context, on the model's device.
        Computed on the host: the rule walks token groups in Python, which on a GPU means a device
        round trip per step."""
        ids = torch.tensor([ctx.ids])
        if ctx.images:
            mm_types = (ids == self.image_token_id).int()
            grids = torch.tensor([s.grid_thw for s in ctx.images])
            pos, _ = self.model.model.get_rope_index(ids, mm_token_type_ids=mm_types, image_grid_thw=grids)
        else:
            pos = torch.arange(len(ctx.ids)).view(1, 1, -1).expand(3, 1, -1)
        return pos.to(self.device, non_blocking=True)

    def forward(
        self, ids: torch.Tensor, pos: torch.Tensor, cache, feats: list[Features], keep: int = 1
    ) -> torch.Tensor:
        """Run `ids [1, S]` at `pos [3, 1, S]` on top of `cache`; logits of the last `keep` positions
        `[keep, V]`."""
        mm = None
        if feats:
            from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

            levels = len(feats[0].deepstack)
            mm = {
                "image": BaseModelOutputWithDeepstackFeatures(
                    pooler_output=tuple(f.embeds for f in feats),
                    deepstack_features=[tuple(f.deepstack[i] for f in feats) for i in range(levels)],
                )
            }
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            cache=cache,
            mm_encoder_outputs=mm,
            use_cache=True,
            logits_to_keep=keep,
        )
        return out.logits[0, -keep:]

    def embed(self, ids: torch.Tensor, starts: list[int], feats: list[Features]) -> tuple[torch.Tensor, list]:
        """Token embeddings `[1, S, H]` with each image's features written at its placeholders (image
        `i` starts at `starts[i]`), and per DeepStack level `(index, features)` for `text_forward`."""
        embeds = self.model.model.language_model.embed_tokens(ids)
        if not feats:
            return embeds, []
        index = torch.cat([torch.arange(s, s + f.n_tokens) for s, f in zip(starts, feats, strict=True)]).to(self.device)
        embeds[0].index_copy_(0, index, torch.cat([f.embeds for f in feats]).to(embeds.dtype))
        levels = len(feats[0].deepstack)
        return embeds, [(index, torch.cat([f.deepstack[i] for f in feats])) for i in range(levels)]

    def render(self, messages: list[dict], tools, add_generation_prompt: bool) -> str:
        return self.processor.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def enforce_memory_cap(self, keep: LocalSession) -> None:
        """Drop the KV caches of the least recently used idle sessions beyond the memory cap."""
        cap = self.settings.session_memory_mb * 2**20
        busy = self.batcher.active_sessions() if self.batcher is not None else set()
        sessions = sorted((s for s in self.live_sessions() if s.id not in busy), key=lambda s: s.last_used)
        total = sum(s.kv_bytes() for s in sessions)
        for s in sessions:
            if total <= cap:
                break
            if s is not keep:
                total -= s.kv_bytes()
                s.drop_cache()


__all__ = ["ImageSpan", "LocalSession", "Qwen3VLEngine", "pick_device"]
