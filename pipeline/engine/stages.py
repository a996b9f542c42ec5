"""The stage contracts: what ingest, retrieval, packing and the API need from an embedder and a generator.

:class:`TextEmbedder` and :class:`TextGenerator` are structural (``typing.Protocol``):
the llama.cpp classes (:class:`pipeline.engine.embed.Embedder`,
:class:`pipeline.engine.generator.Engine`) satisfy them, and so do the deterministic
fakes the fast tests use (``tests/fakes.py``) or, later, remote backends.
:class:`EngineStats` and :class:`Generation` are what a generator returns. Nothing
here loads a model or imports llama.cpp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import numpy as np


@dataclass
class EngineStats:
    """What one prompt cost, mostly from llama.cpp's own performance counters."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens_per_second: float = 0.0
    ttft_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_tokens_per_second: float = 0.0
    load_seconds: float = 0.0
    cache: str = "none"  # none | memory (kept in the KV cache) | disk (restored) | miss
    cache_load_seconds: float = 0.0
    states_saved: int = 0  # prefix states written by this prompt (whole prefix and boundaries)
    cache_save_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d


class Generation:
    """A streamed completion: iterate for text pieces; ``stats`` is complete once iteration ends."""

    def __init__(self, pieces: Iterator[str], stats: EngineStats):
        self._pieces = pieces
        self.stats = stats
        self.text = ""

    def __iter__(self) -> Iterator[str]:
        for piece in self._pieces:
            self.text += piece
            yield piece

    def read(self) -> str:
        for _ in self:
            pass
        return self.text

    def close(self) -> None:
        """Stop generating now: the generator gives its context back and settles its figures."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


@runtime_checkable
class TextEmbedder(Protocol):
    """Chunks and queries → unit vectors, in the embedder's own tokens.

    ``sequence(text)`` is one embedding input (special tokens added, cut to
    ``max_tokens``); ingest tokenizes on its loader thread with it and embeds the
    sequences with ``embed_tokens``. ``identity`` names the model's contents: a
    collection refuses vectors from another embedder.
    """

    model_path: Path

    @property
    def dim(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def identity(self) -> str: ...

    def tokenize(self, text: str) -> list[int]: ...

    def count_tokens(self, text: str) -> int: ...

    def sequence(self, text: str) -> list[int]: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray: ...

    def close(self) -> None: ...


@runtime_checkable
class TextGenerator(Protocol):
    """Prompts → streamed answers, with the prefill figures (:class:`EngineStats`) of each.

    ``generate`` decodes ``tokens``; ``tokens[:prefix_len]`` is the part other prompts
    share, and ``boundaries`` the earlier points where a shared part may end (document
    and section ends); the generator may reuse state up to one of them (in memory or
    from a saved state) and reports it in ``stats.cached_tokens``. ``reusable`` says how
    much it would reuse now, without running anything (what a packer weighs candidate
    prompts by); ``warm(prefix)`` saves a prefix's state ahead of the first question
    (True if it was saved now). ``namespace`` names the model and settings states belong to.

    Optional keyword arguments of ``generate``, passed only to a generator whose
    signature has them: ``stop_tokens`` (ids that end the answer), ``progress(done,
    total)`` (after each prefilled piece) and ``cancel`` (a :class:`~.turns.CancelToken`).
    """

    @property
    def namespace(self) -> str: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def bos(self) -> list[int]: ...

    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def count_tokens(self, text: str) -> int: ...

    def chat(self, system: str, user: str) -> str: ...

    def generate(self, tokens: Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, prefix_len: int = 0,
                 boundaries: Sequence[int] = (), stats: EngineStats | None = None) -> Generation: ...

    def reusable(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = ()) -> int: ...

    def warm(self, prefix: Sequence[int], *, boundaries: Sequence[int] = ()) -> bool: ...

    def close(self) -> None: ...


__all__ = ["EngineStats", "Generation", "TextEmbedder", "TextGenerator"]
