"""The engine's contract: what ingest, retrieval, packing, asking and summaries may rely on.

:class:`TextEmbedder` and :class:`TextGenerator` are structural (``typing.Protocol``) and
declare *every* member callers use, the optional capabilities included, so no caller
probes a generator with ``hasattr`` or ``inspect.signature``. :class:`EmbedderBase` and
:class:`GeneratorBase` give the capabilities a backend may lack their meaning by
default (one sequence at a time, no queue, no template of its own...): the local
llama.cpp classes (:class:`~.local.Engine`, :class:`~.embed.Embedder`), the remote ones
(:mod:`.remote`) and the deterministic fakes of the fast tests (``tests/support/fakes.py``)
derive from them and override what they do better.

:class:`EngineStats`, :class:`Generation` and :class:`Completion` are what a generator
returns. Nothing here loads a model or imports llama.cpp.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from .context_lock import CancelToken
    from .cache.calibrations import Calibration
    from .reuse.budget import Refusal
    from ..records import PromptShape


class CacheKind(str, enum.Enum):
    """Where a prompt's reused state came from: the closed set ``EngineStats.cache`` takes."""

    NONE = "none"  # nothing reused, nothing looked up
    MEMORY = "memory"  # kept in the engine's KV cache from the previous prompt
    RAM = "ram"  # restored from a state kept in host memory
    DISK = "disk"  # restored from the prefix cache on disk
    COMPOSED = "composed"  # composed from section states
    MISS = "miss"  # looked up, nothing found
    SERVER = "server"  # reused by a generator server (its own cache)

    def __str__(self) -> str:
        return self.value


def _rate(tokens: str, seconds: str) -> Any:
    """A rate field of :class:`EngineStats`: what a sum computes again from the two counters it divides,
    never adds."""
    return field(default=0.0, metadata={"rate_of": (tokens, seconds)})


def _engine_fact() -> Any:
    """A field of :class:`EngineStats` that tells of the engine, not the prompt (every prompt an engine
    answers carries the same value): a sum keeps the largest, never adds."""
    return field(default=0.0, metadata={"engine_fact": True})


@dataclass
class EngineStats:
    """What one prompt cost, mostly from llama.cpp's own performance counters.

    Every number is a counter that adds up over prompts (:meth:`add`), but the rates, which name the
    counters they divide, and the engine's facts (its model's load time), which a sum keeps the largest
    of; a new numeric field is a counter without being listed anywhere else.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens_per_second: float = _rate("prefill_tokens", "prefill_seconds")
    ttft_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_tokens_per_second: float = _rate("decode_tokens", "decode_seconds")
    load_seconds: float = _engine_fact()  # the model's load, once per engine
    cache: CacheKind = CacheKind.NONE
    cache_load_seconds: float = 0.0
    states_saved: int = 0  # prefix states written by this prompt (whole prefix and boundaries)
    cache_save_seconds: float = 0.0
    composed_sections: int = 0  # sections restored from their saved states (a composed prompt)
    recomputed_tokens: int = 0  # tokens decoded again at the seams of moved sections
    sections_lost: list[str] = field(default_factory=list)  # why each section computed now was not reused
    plan: str = ""  # the way the reuse planner chose: "exact" or "composed" ("" where no planner ran)
    predicted_seconds: float = 0.0  # the plan's predicted time to the first token (measured: ttft_seconds)
    predicted_exact_seconds: float = 0.0  # the same, had the prompt been prefilled exactly
    notes: list[str] = field(default_factory=list)

    def __setattr__(self, name: str, value) -> None:
        if name == "cache":
            value = CacheKind(value)  # a closed set: anything else is a ValueError here, not a surprise later
        super().__setattr__(name, value)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
            elif isinstance(v, CacheKind):
                d[k] = v.value
        return d

    @classmethod
    def counters(cls) -> tuple[str, ...]:
        """The fields that add up over prompts: every number but the rates and the engine's facts."""
        return tuple(f.name for f in fields(cls)
                     if _numeric(f.default) and "rate_of" not in f.metadata and "engine_fact" not in f.metadata)

    def add(self, other: EngineStats) -> EngineStats:
        """Add ``other``'s counters to these and compute the rates again from the sums; returns ``self``.

        What several prompts cost together (a summary's units, a whole job). The engine's facts keep the
        largest (a job's model loaded once per engine, not once per prompt). The cache kind, the plan, the
        notes and the sections lost describe one prompt and are left as they are.
        """
        for name in self.counters():
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for f in fields(self):
            if "engine_fact" in f.metadata:
                setattr(self, f.name, max(getattr(self, f.name), getattr(other, f.name)))
            elif "rate_of" in f.metadata:
                tokens, seconds = (getattr(self, name) for name in f.metadata["rate_of"])
                setattr(self, f.name, tokens / seconds if seconds else 0.0)
        return self

    def figures(self) -> dict[str, int | float]:
        """The counters and the rates, rounded as :meth:`to_dict` rounds them: what a report of a sum shows."""
        d = self.to_dict()
        return {f.name: d[f.name] for f in fields(self) if _numeric(f.default)}


def _numeric(value: object) -> bool:
    return type(value) in (int, float)


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

    ``generate`` decodes a prompt: a :class:`~pipeline.records.PromptShape` (its tokens, the cuts
    where a part shared with other prompts may end, and a sections-mode prompt's sections) or
    plain tokens that share nothing. The generator may reuse state up to a cut (in memory or
    from a saved state), or compose a sections-mode prompt from section states (the local
    engine, see :mod:`.reuse.planner`), and reports it in ``stats``. Every generator takes
    ``stop_tokens`` (ids that end the answer), ``progress(done, total)`` (after each prefilled
    piece) and ``cancel`` (a :class:`~.context_lock.CancelToken`); one that cannot honour one
    of them says so in its ``generate``.

    Reuse, without running anything: ``reusable`` is how much of a prompt it would reuse
    now from anywhere (what a packer weighs candidate prompts by), ``held`` how much its
    own memory holds (what a pool routes by), ``warm(prompt)`` saves the state of a prompt's
    shared prefix (and at its cuts) ahead of the first question (True if it was saved now), ``warm_sections`` saves each
    section's own state for composed prompts, and ``reset`` forgets what the memory holds.
    ``namespace`` names the model and settings states belong to. ``calibrate_pending`` measures
    composition against an exact answer that asked for it (once the answer is done),
    ``composition_refusal()`` says why prompts are not composed (None: they are) and
    ``composes`` whether they are (a packer orders sections by it).

    Capacity: ``waiting`` is its queue (the running prompt included), ``n_seq_max`` how
    many prompts over one prefix ``generate_many`` decodes together, and ``workers()`` the
    generators a batch job may spread over (one per server).
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

    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def count_tokens(self, text: str) -> int: ...

    def chat(self, system: str, user: str) -> str: ...

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str | None: ...

    def generate(self, prompt: PromptShape | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
                 cancel: CancelToken | None = None) -> Generation: ...

    def generate_many(self, prompts: Sequence[PromptShape], *, max_tokens: int = 256, temperature: float = 0.0,
                      repeat_penalty: float = 1.0, seed: int | None = None) -> list[Completion]: ...

    def reusable(self, prompt: PromptShape | Sequence[int]) -> int: ...

    def held(self, prompt: PromptShape | Sequence[int]) -> int: ...

    @property
    def composes(self) -> bool: ...

    def calibrate_pending(self, *, cancel: CancelToken | None = None) -> Calibration | None: ...

    def calibrate(self, prompt: PromptShape, *, repeat_penalty: float, cancel: CancelToken | None = None,
                  progress: Callable[[int], None] | None = None) -> Calibration | None: ...

    def composition_refusal(self, *, calibrated: bool = True) -> Refusal | None: ...

    def warm(self, prompt: PromptShape) -> bool: ...

    def warm_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]], *,
                      progress: Callable[[int], None] | None = None, cancel: CancelToken | None = None,
                      on_wait: Callable[[str], None] | None = None) -> dict: ...

    def reset(self) -> None: ...

    def workers(self) -> list[TextGenerator]: ...

    def close(self) -> None: ...


class GeneratorBase:
    """Defaults for the capabilities of :class:`TextGenerator` a backend may lack.

    A backend provides ``namespace``, ``n_ctx``, ``bos``, ``tokenize``, ``chat``,
    ``generate``, ``reusable``, ``warm`` and ``close``; it inherits one prompt at a time
    (``generate_many`` runs them one after another, ``n_seq_max`` 1), no queue, a memory
    no template of its own for stop markers, one worker (itself), ``held`` equal to
    ``reusable``, and no composition (nothing to calibrate).
    """

    @property
    def waiting(self) -> int:
        return 0

    @property
    def n_seq_max(self) -> int:
        return 1

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))  # type: ignore[attr-defined]

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str | None:
        return None

    def generate_many(self, prompts: Sequence[PromptShape], *, max_tokens: int = 256, temperature: float = 0.0,
                      repeat_penalty: float = 1.0, seed: int | None = None) -> list[Completion]:
        """Each prompt through ``generate``, one after another."""
        out = []
        for p in prompts:
            g = self.generate(p, max_tokens=max_tokens, temperature=temperature,  # type: ignore[attr-defined]
                              repeat_penalty=repeat_penalty, seed=seed)
            out.append(Completion(g.read(), g.stats))
        return out

    def held(self, prompt: PromptShape | Sequence[int]) -> int:
        """What this generator's memory holds of the prompt: by default, what it would reuse from anywhere."""
        return self.reusable(prompt)  # type: ignore[attr-defined]

    @property
    def composes(self) -> bool:
        """Whether this generator may compose prompts from section states: only a local engine can."""
        return False

    def composition_refusal(self, *, calibrated: bool = True) -> Refusal | None:
        """Why prompts are not composed: a server reuses prefixes only."""
        from .reuse.budget import Refusal

        return Refusal.SERVER

    def calibrate_pending(self, *, cancel: CancelToken | None = None) -> Calibration | None:
        """Nothing to measure: only a local engine composes."""
        return None

    def calibrate(self, prompt: PromptShape, *, repeat_penalty: float, cancel: CancelToken | None = None,
                  progress: Callable[[int], None] | None = None) -> Calibration | None:
        """Nothing to measure: only a local engine composes."""
        return None

    def reset(self) -> None:
        pass

    def warm_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]], *,
                      progress: Callable[[int], None] | None = None, cancel: CancelToken | None = None,
                      on_wait: Callable[[str], None] | None = None) -> dict:
        """Save each section's own state ahead of composed prompts: only a local engine can."""
        from ..errors import EngineError

        raise EngineError("this generator cannot save section states (only a local llama.cpp engine composes "
                          "prompts from them)")

    def workers(self) -> list[TextGenerator]:
        return [self]  # type: ignore[list-item]


__all__ = ["CacheKind", "Completion", "EmbedderBase", "EngineStats", "Generation", "GeneratorBase", "TextEmbedder",
           "TextGenerator"]
