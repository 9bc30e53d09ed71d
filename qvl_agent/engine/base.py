"""The engine contract every backend keeps: local transformers, remote OpenAI-compatible, replay.

An `Engine` is built once and held resident. A `Session` is one conversation: it is opened on zero or
more images, and each `ask` appends a user turn (text plus optional new images, e.g. the next screenshot
of an agent step) and streams the assistant's reply as text pieces. After the stream ends,
`session.last_stats` holds that turn's `TurnStats`. `cancel()` may be called from any thread; the
running turn then stops at the next token and raises `GenerationCancelled` from the stream.

This module knows nothing about torch, HTTP or files: backends live beside it.
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from qvl_agent.errors import GenerationCancelled
from qvl_agent.image import Screenshot

STATS_KEYS = (
    "preprocess_ms",
    "vision",
    "vision_ms",
    "prefill_tokens",
    "ttft_ms",
    "decode_tokens",
    "decode_tokens_per_s",
    "total_ms",
)


@dataclass(frozen=True)
class TurnStats:
    """What one turn cost. `vision` is "hit" when every image's features came from the cache, "miss"
    when the vision tower ran, "none" for a turn without new images."""

    preprocess_ms: float = 0.0
    vision: str = "none"
    vision_ms: float = 0.0
    prefill_tokens: int = 0  # tokens actually run through the model before the first new token
    ttft_ms: float = 0.0
    decode_tokens: int = 0
    decode_tokens_per_s: float = 0.0
    total_ms: float = 0.0
    prompt_tokens: int = 0  # the whole context before this turn's reply
    cached_tokens: int = 0  # of those, how many came from a reused KV cache
    draft_accepted: int = 0  # reply tokens that were drafted and verified, without a forward of their own
    decode_path: str = ""  # local engine: "eager", "plain graphs", "compiling i/n" or "compiled"
    decode_batch: float = 1.0  # local engine: turns per decode step this reply shared, on average
    decode_batch_max: int = 1  # and at most

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Turn:
    """One user turn and the reply it got, as the session remembers it."""

    text: str
    images: tuple[Screenshot, ...]
    reply: str


GREEDY_BELOW = 1e-4  # a temperature under this samples the top token anyway (a gap of 0.01 becomes e^100)


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted from each such logit once per time the token was generated
    stop: tuple[str, ...] = ()
    min_new_tokens: int = 0  # benchmarks force fixed lengths; nobody else should need this
    # Benchmarks force a reply (random weights never write a tool call) to time how it decodes: token i
    # is force_ids[i] instead of the model's choice. Nobody else should need this.
    force_ids: tuple[int, ...] = ()
    # The reply begins with this text, written for the model, which goes on from there (an API client's
    # tool_choice: the opening of a call). Only engines whose `writes_reply_prefix` is true honour it.
    reply_prefix: str = ""

    def __post_init__(self) -> None:
        # A temperature this small picks the top token every time, but dividing logits by it overflows to
        # inf and the probabilities to NaN: it is greedy, said the one way the decoders all read.
        if self.temperature < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)

    @classmethod
    def sampling(cls, **overrides) -> GenerationOptions:
        """The model card's sampling recipe for Qwen3-VL Instruct (temperature 0.7, top_p 0.8, top_k 20,
        presence_penalty 1.5). Greedy (the default) stays what agents and tests use."""
        recipe = dict(temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5)
        return cls(**(recipe | overrides))


# Qwen3-VL-2B-Instruct's model card: how to sample when sampling at all (temperature > 0). Greedy
# decoding (temperature 0) stays the default for actions and grounding.
SAMPLING_RECIPE = {"top_p": 0.8, "top_k": 20, "presence_penalty": 1.5}


def sampling_defaults(temperature: float) -> dict:
    """The model card's top_p/top_k/presence_penalty when `temperature` samples; the greedy no-ops otherwise."""
    if temperature >= GREEDY_BELOW:
        return dict(SAMPLING_RECIPE)
    return {"top_p": 1.0, "top_k": 0, "presence_penalty": 0.0}


class Session(ABC):
    """One conversation with the engine. Not thread-safe except `cancel`."""

    def __init__(self, images: Sequence[Screenshot] = (), system: str | None = None, tools: list | None = None):
        self.id = uuid.uuid4().hex
        self.system = system
        self.tools = tools
        self.pending_images: tuple[Screenshot, ...] = tuple(images)  # shown with the first question
        # A model profile's input order: True puts each user turn's text before its images (MAI-UI was
        # trained that way); every backend builds its messages in this order.
        self.text_first = False
        self.turns: list[Turn] = []
        self.last_stats: TurnStats | None = None
        self._cancel = threading.Event()

    def ask(
        self,
        text: str,
        images: Sequence[Screenshot] = (),
        options: GenerationOptions | None = None,
    ) -> Iterator[str]:
        """Stream the reply to `text` (plus `images`, shown before the text unless `text_first`) as text pieces.

        The turn starts now: a `cancel()` from this point on stops it, even before the first piece is
        read. A turn that ends, is cancelled or is abandoned by its reader joins the history; one that
        fails does not, and the session's opening images wait for the next question."""
        pending = self.pending_images
        self.pending_images = ()
        self._cancel.clear()
        return self._turn(text, pending, pending + tuple(images), options or GenerationOptions())

    def _turn(self, text, pending, images, options) -> Iterator[str]:
        pieces: list[str] = []
        try:
            for piece in self._generate(text, images, options):
                pieces.append(piece)
                yield piece
        except (GenerationCancelled, GeneratorExit):
            self.turns.append(Turn(text, images, "".join(pieces)))
            raise
        except BaseException:
            self.pending_images = pending + self.pending_images
            raise
        self.turns.append(Turn(text, images, "".join(pieces)))

    def complete(self, text: str, images: Sequence[Screenshot] = (), options: GenerationOptions | None = None) -> str:
        """The whole reply at once."""
        return "".join(self.ask(text, images, options))

    def add_turn(self, text: str, images: Sequence[Screenshot] = (), reply: str = "") -> None:
        """Record a turn that happened elsewhere (a stateless client's history) without generating.
        The next `ask` sees it as context; engines that keep a KV cache reuse whatever prefix matches."""
        images = self.pending_images + tuple(images)
        self.pending_images = ()
        self.turns.append(Turn(text, images, reply))

    def prefetch(self, images: Sequence[Screenshot] = ()) -> None:
        """Show `images` with the next question, and get them ready now if the backend can (the local
        engine encodes them and runs everything before the question's text, so the answer starts as
        soon as the question arrives). Here: they just wait for the next `ask`."""
        self.pending_images = self.pending_images + tuple(images)

    def cancel(self) -> None:
        """Stop the running turn at its next token. Safe from any thread."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def close(self) -> None:
        """Free what the session holds (KV cache). The session cannot be used afterwards."""

    @abstractmethod
    def _generate(self, text: str, images: tuple[Screenshot, ...], options: GenerationOptions) -> Iterator[str]:
        """Yield the reply's text pieces and set `self.last_stats` before returning."""


class Engine(ABC):
    """A resident model. `name` identifies what answers (model id, server URL or replay file)."""

    name: str = "engine"
    writes_reply_prefix: bool = False  # whether `GenerationOptions.reply_prefix` is honoured
    profile = None  # the model profile grounding asks and reads with (qvl_agent.profiles); open_engine sets it

    @abstractmethod
    def open_session(
        self, images: Sequence[Screenshot] = (), system: str | None = None, tools: list | None = None
    ) -> Session:
        """A new, isolated conversation about `images`."""

    def close(self) -> None:
        """Release the model and every session."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Request:
    """What a session was asked, as recorded by the replay engine (tests check what the model saw)."""

    session_id: str
    system: str | None
    text: str
    image_hashes: list[str] = field(default_factory=list)
    tools: list | None = None  # the tool definitions the session shows the model
    history: list[tuple[str, str]] = field(default_factory=list)  # (user text, reply) of earlier turns
    image_sizes: list[tuple[int, int]] = field(default_factory=list)  # width, height of each image sent
    text_first: bool = False  # the text went before the images
