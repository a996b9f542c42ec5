"""The engine's contract: what ingest, retrieval, packing, asking and summaries may rely on.

:class:`TextEmbedder` and :class:`TextGenerator` are structural (``typing.Protocol``) and
declare *every* member callers use, the optional capabilities included, so no caller
probes a generator with ``hasattr`` or ``inspect.signature``. :class:`EmbedderBase` and
:class:`GeneratorBase` give the capabilities a backend may lack their meaning by
default (one sequence at a time, no queue, no template of its own...): the local
llama.cpp classes (:class:`~.local.Engine`, :class:`~.embed.Embedder`), the remote ones
(:mod:`.remote`) and the deterministic fakes of the fast tests (``tests/fakes.py``)
derive from them and override what they do better.

:class:`EngineStats`, :class:`Generation` and :class:`Completion` are what a generator
returns. Nothing here loads a model or imports llama.cpp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from .reuse.seams import Sections
    from .context_lock import CancelToken


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
    cache: str = "none"  # none | memory (kept in the KV cache) | ram | disk (restored) | composed | miss | server
    cache_load_seconds: float = 0.0
    states_saved: int = 0  # prefix states written by this prompt (whole prefix and boundaries)
    cache_save_seconds: float = 0.0
    composed_sections: int = 0  # sections restored from their saved states (a composed prompt)
    recomputed_tokens: int = 0  # tokens decoded again at the seams of moved sections
    sections_lost: list[str] = field(default_factory=list)  # why each section computed now was not reused
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
        close = getattr(self._pieces, "close", None)  # a plain iterator has nothing to close
        if close is not None:
            close()


@dataclass
class Completion:
    """One prompt's whole answer and its figures (what :meth:`TextGenerator.generate_many` returns)."""

    text: str
    stats: EngineStats


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


class EmbedderBase:
    """Defaults for :class:`TextEmbedder`: counting and embedding texts through ``tokenize``,
    ``sequence`` and ``embed_tokens``, which a backend provides; nothing to close."""

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))  # type: ignore[attr-defined]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised embeddings, one row per text, in order."""
        return self.embed_tokens([self.sequence(t) for t in texts])  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


@runtime_checkable
class TextGenerator(Protocol):
    """Prompts → streamed answers, with the prefill figures (:class:`EngineStats`) of each.

    ``generate`` decodes ``tokens``; ``tokens[:prefix_len]`` is the part other prompts
    share, and ``boundaries`` the earlier points where a shared part may end (document
    and section ends); the generator may reuse state up to one of them (in memory or
    from a saved state) and reports it in ``stats.cached_tokens``. Every generator takes
    ``stop_tokens`` (ids that end the answer), ``progress(done, total)`` (after each
    prefilled piece) and ``cancel`` (a :class:`~.context_lock.CancelToken`); one that cannot
    honour one of them says so in its ``generate``. ``sections`` is a sections-mode prompt's
    layout (head and section ends), which a generator may compose the prompt from section
    states by (the local engine, see :mod:`.section_reuse`); others ignore it.

    Reuse, without running anything: ``reusable`` is how much of a prompt it would reuse
    now from anywhere (what a packer weighs candidate prompts by), ``held`` how much its
    own memory holds (what a pool routes by), ``warm(prefix)`` saves a prefix's state
    ahead of the first question (True if it was saved now), ``warm_sections`` saves each
    section's own state for composed prompts, and ``reset`` forgets what the memory holds. ``namespace`` names the model and settings states belong to.

    Capacity: ``waiting`` is its queue (the running prompt included), ``n_seq_max`` how
    many prompts over one prefix ``generate_many`` decodes together, ``can_trim`` whether
    its memory can be cut at any position (false for recurrent and hybrid models), and
    ``workers()`` the generators a batch job may spread over (one per server).
    ``render(messages)`` is the generator's own chat template applied to ``messages``
    (None where it has none it renders itself): where default stop markers come from.
    """

    @property
    def namespace(self) -> str: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def bos(self) -> list[int]: ...

    @property
    def waiting(self) -> int: ...

    @property
    def n_seq_max(self) -> int: ...

    @property
    def can_trim(self) -> bool: ...

    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def count_tokens(self, text: str) -> int: ...

    def chat(self, system: str, user: str) -> str: ...

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str | None: ...

    def generate(self, tokens: Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, prefix_len: int = 0,
                 boundaries: Sequence[int] = (), stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
                 cancel: CancelToken | None = None, sections: Sections | None = None) -> Generation: ...

    def generate_many(self, prompts: Sequence[Sequence[int]], *, prefix_len: int, boundaries: Sequence[int] = (),
                      max_tokens: int = 256, temperature: float = 0.0, repeat_penalty: float = 1.0,
                      seed: int | None = None) -> list[Completion]: ...

    def reusable(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = (),
                 sections: Sections | None = None) -> int: ...

    def held(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = (),
             sections: Sections | None = None) -> int: ...

    def warm(self, prefix: Sequence[int], *, boundaries: Sequence[int] = ()) -> bool: ...

    def warm_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]], *,
                      progress: Callable[[int, int], None] | None = None) -> dict: ...

    def reset(self) -> None: ...

    def workers(self) -> list[TextGenerator]: ...

    def close(self) -> None: ...


class GeneratorBase:
    """Defaults for the capabilities of :class:`TextGenerator` a backend may lack.

    A backend provides ``namespace``, ``n_ctx``, ``bos``, ``tokenize``, ``chat``,
    ``generate``, ``reusable``, ``warm`` and ``close``; it inherits one prompt at a time
    (``generate_many`` runs them one after another, ``n_seq_max`` 1), no queue, a memory
    that can be cut anywhere, no template of its own for stop markers, one worker (itself),
    and ``held`` equal to ``reusable``.
    """

    @property
    def waiting(self) -> int:
        return 0

    @property
    def n_seq_max(self) -> int:
        return 1

    @property
    def can_trim(self) -> bool:
        return True

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))  # type: ignore[attr-defined]

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str | None:
        return None

    def generate_many(self, prompts: Sequence[Sequence[int]], *, prefix_len: int, boundaries: Sequence[int] = (),
                      max_tokens: int = 256, temperature: float = 0.0, repeat_penalty: float = 1.0,
                      seed: int | None = None) -> list[Completion]:
        """Each prompt through ``generate``, one after another."""
        out = []
        for p in prompts:
            g = self.generate(p, max_tokens=max_tokens, temperature=temperature,  # type: ignore[attr-defined]
                              repeat_penalty=repeat_penalty, seed=seed, prefix_len=prefix_len, boundaries=boundaries)
            out.append(Completion(g.read(), g.stats))
        return out

    def held(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = (),
             sections: Sections | None = None) -> int:
        """What this generator's memory holds of the prompt: by default, what it would reuse from anywhere."""
        return self.reusable(tokens, prefix_len=prefix_len, boundaries=boundaries,  # type: ignore[attr-defined]
                             sections=sections)

    def reset(self) -> None:
        pass

    def warm_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]], *,
                      progress: Callable[[int, int], None] | None = None) -> dict:
        """Save each section's own state ahead of composed prompts: only a local engine can."""
        from ..errors import EngineError

        raise EngineError("this generator cannot save section states (only a local llama.cpp engine composes "
                          "prompts from them)")

    def workers(self) -> list[TextGenerator]:
        return [self]  # type: ignore[list-item]


__all__ = ["Completion", "EmbedderBase", "EngineStats", "Generation", "GeneratorBase", "TextEmbedder",
           "TextGenerator"]
