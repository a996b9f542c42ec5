"""Typed settings: defaults here, then a TOML file, then ``RAG_*`` environment variables, then flags.

The dataclass defaults *are* the embedded default configuration
(``configs/default.toml`` repeats them for reading, and a test keeps the two equal).
Every layer is validated the same way: an unknown section or key is an error
that names it, and a value of the wrong type is an error that names the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import ConfigError
from .engine.gguf.ggml import KV_TYPE_IDS
from .store.names import check_collection_name
from .store.vectors import check_store_urls

ENV_PREFIX = "RAG_"
# Variables with a meaning of their own, not "section_key" overrides.
_ENV_RESERVED = {"RAG_HOME", "RAG_CONFIG", "RAG_TEST_MINILM_DIR", "RAG_LLAMA_CMAKE_ARGS",
                 "RAG_STORE_TOKEN",  # the Chroma server's token: read by pipeline.store.vectors, never a setting
                 "RAG_SERVE_TOKEN"}  # the token of `rag serve`: a secret, never a setting
_ENV_RESERVED_PREFIXES = ("RAG_TEST_",)  # the test suite's own knobs


class ConfigWarning(UserWarning):
    """A setting that is probably a mistake but not an error, e.g. a ``RAG_*`` variable that matches nothing."""


@dataclass(frozen=True)
class ModelsConfig:
    """Which models to use: ``builtin:NAME``, a path to a ``.gguf`` file, or ``hf:owner/repo/file.gguf``."""

    embedder: str = "builtin:all-MiniLM-L6-v2"
    """The embedding model: builtin:NAME, a .gguf path, hf:owner/repo/file.gguf or openai:URL#model."""
    generator: str = "builtin:SmolLM2-135M-Instruct"
    """The model that writes answers and summaries; the same reference forms as models.embedder."""
    embedder_query_prefix: str = "auto"
    """Text put before every query the embedder sees (e5: "query: "); "auto" = the model's own, "" = none."""
    embedder_document_prefix: str = "auto"
    """Text put before every chunk at ingest (e5: "passage: "); "auto" = the model's own, "" = none."""


@dataclass(frozen=True)
class ChunkingConfig:
    """Chunk and section sizes, in tokens of the embedder's own tokenizer.

    With ``contextual``, each chunk is embedded and BM25-indexed with its document
    title and heading path in front (never shown in passages); changing it needs a
    re-ingest into a fresh collection to take effect on stored chunks. Sections (runs
    of chunks that prompts are built from) are cut once per document version;
    ``section_tokens = 0`` sizes them from the context length (a quarter of
    ``engine.n_ctx``, at most 4096).
    """

    size: int = 256
    """Chunk length in embedder tokens: the unit that is embedded, BM25-indexed and retrieved."""
    overlap: int = 32
    """Tokens each chunk repeats from the one before, so a sentence cut at a boundary is still found."""
    contextual: bool = True
    """Embed and index each chunk with its title and heading path in front (never shown in passages)."""
    section_tokens: int = 0
    """Section length in embedder tokens (runs of chunks prompts are built from); 0 = n_ctx / 4, at most 4096."""
    doc2query: int = 0
    """Questions the generator writes per chunk at ingest, indexed and embedded with it (doc2query); 0 = off (slow)."""


@dataclass(frozen=True)
class IngestConfig:
    """What ``rag ingest`` reads. Files over ``max_file_mb`` (decompressed, for ``.gz``) are skipped
    and reported; 0 = no limit. ``follow_symlinks`` also follows links that leave the folder."""

    max_file_mb: float = 32.0
    """Files larger than this (decompressed, for .gz) are skipped and reported; 0 = no limit."""
    follow_symlinks: bool = False
    """Also follow symlinks that lead outside the folder being ingested."""


@dataclass(frozen=True)
class EmbedConfig:
    """How the embedder runs. ``batch_tokens = 0`` lets the hardware decide how chunks are grouped per decode."""

    threads: int = 0
    """CPU threads of the embedder; 0 = every usable core but one (left to the loader thread)."""
    flash_attn: bool = True
    """Run the embedder with flash attention (faster on a CPU too)."""
    gpu_layers: int = 0
    """Layers of the embedder on the GPU on a GPU build (-1 = all, 0 = none)."""
    batch_tokens: int = 0
    """Tokens packed into one decode; 0 = follow the hardware (one chunk on a CPU, 4096 on a GPU)."""


@dataclass(frozen=True)
class StoreConfig:
    """Where vectors and the lexical index live. An empty ``path`` means ``$RAG_HOME/store``.

    ``url`` (``http://host:port``) puts the vectors in a Chroma server and ``catalog_url``
    (``postgresql://...``) the catalog, full-text index and job state in PostgreSQL; with
    both, many processes share the collection (see :mod:`pipeline.store.store`). A Chroma
    token comes from ``RAG_STORE_TOKEN`` only, a PostgreSQL password from the URL or libpq's
    own ``PGPASSWORD`` / ``~/.pgpass``. ``catalog_pool`` bounds the PostgreSQL connections
    one process keeps to the catalog (see :mod:`pipeline.store.pg_pool`).
    """

    path: str = ""
    """Directory of the embedded store (Chroma files and SQLite catalog); empty = $RAG_HOME/store."""
    collection: str = "default"
    """The collection commands read and write, so that corpora stay apart in one store."""
    wait: float = 10.0
    """Seconds to wait for another rag process holding the embedded store before exiting with status 5."""
    url: str = ""
    """A Chroma server (http://host:port) for the vectors, so many processes share them; empty = embedded."""
    catalog_url: str = ""
    """PostgreSQL (postgresql://...) for catalog, full-text index and job state; empty = SQLite in path."""
    catalog_pool: int = 8
    """Most PostgreSQL connections one process keeps open to catalog_url."""


@dataclass(frozen=True)
class RetrievalConfig:
    """Hybrid retrieval: dense (Chroma) and lexical (BM25) hits fused by reciprocal rank, then
    the top ``rerank_candidates`` reranked (``rerank``: "scores" = both sides' normalised
    scores combined with ``rerank_dense_weight`` for the dense side; "none" = fusion only)."""

    top_k: int = 5
    """Hits `rag search` (and Pipeline.search) returns unless told otherwise."""
    dense: bool = True
    """Search the vectors in Chroma (semantic matches)."""
    lexical: bool = True
    """Search the BM25 full-text index (exact terms, identifiers, flags)."""
    candidates: int = 40
    """Hits taken from each side before fusion."""
    rrf_k: int = 60
    """Reciprocal-rank fusion constant: a hit at rank r weighs 1 / (rrf_k + r)."""
    rerank: str = "scores"
    """After fusion: "scores" re-scores candidates on both sides' scores; "none" keeps the fused order."""
    rerank_candidates: int = 40
    """Fused candidates the reranker re-scores."""
    rerank_dense_weight: float = 0.5
    """The dense side's share of a reranked score (the lexical side gets the rest)."""
    rerank_normalise: str = "max"
    """How each side's scores are scaled before combining: "max" (by the best) or "minmax" (to [0, 1])."""
    fusion: str = "adaptive"
    """How the sides combine: "adaptive" weighs BM25 per query by how much of its rare-word weight matched; "rrf" evenly."""
    lexical_floor: float = 0.1
    """Adaptive fusion: a query whose best BM25 hit holds at most this share of its idf weight is ranked by dense alone."""
    lexical_full: float = 0.5
    """Adaptive fusion: from this share of the query's idf weight matched, BM25 counts fully (as with "rrf")."""
    hyde: bool = False
    """Embed each query with a short answer the generator writes first (HyDE); for a capable generator, one generation a query."""
    hyde_tokens: int = 96
    """Longest hypothetical answer HyDE generates, in generator tokens."""


#: The ``[engine]`` keys that say what llama.cpp runs with and where the weights live: what the
#: planner chooses and a tuned profile sets (threads, seed, RoPE and ``-ot`` patterns are left alone).
PLANNED_KEYS = ("n_ctx", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v", "gpu_layers", "n_cpu_moe",
                "cpu_moe", "cpu_moe_from", "mmap")
#: KV cache types that are not quantised: llama.cpp needs flash attention for any other V cache type.
UNQUANTISED_KV = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class EngineConfig:
    """The generator in llama.cpp, configured for fast prefill: the one settings type of the engine.

    The engine runs it, the planner estimates it (a plan is an ``EngineConfig`` plus its
    memory and speed estimates) and ``rag tune`` measures and saves it; :meth:`validate`
    is the one check all of them use.

    ``n_ctx`` above the model's trained context is clamped (with a warning) unless
    ``rope_scaling`` is set; ``n_ctx = 0`` means the trained context. ``gpu_layers = -1``
    puts every layer and the output head on the GPU (llama.cpp's ``-ngl`` above the layer
    count). Expert offload has llama.cpp's meaning: ``n_cpu_moe`` layers' experts in CPU
    memory (the first or last ``cpu_moe_from``), ``cpu_moe`` for all of them, and
    ``override_tensors`` for ``-ot``-style ``regex=BUFFER`` lists. With ``tuned``, the
    profile ``rag tune`` wrote for this model and context replaces the settings left at
    their defaults (never ones you set).
    """

    n_ctx: int = 8192
    """Context length in tokens, the longest prompt plus answer; 0 = the model's trained context."""
    n_batch: int = 2048
    """Logical batch (llama.cpp's -b): prompt tokens submitted per decode call."""
    n_ubatch: int = 512
    """Micro-batch (-ub): tokens computed at once; larger amortises per-batch costs such as expert copies."""
    flash_attn: bool = True
    """Flash attention: faster prefill, and needed for a quantised V cache."""
    type_k: str = "f16"
    """KV cache type of the keys (f16, q8_0 = half the memory, q4_0 = a quarter, ...)."""
    type_v: str = "f16"
    """KV cache type of the values; a quantised one needs flash_attn."""
    gpu_layers: int = -1
    """Layers on the GPU on a GPU build (-ngl); -1 = every layer and the output head."""
    threads: int = 0
    """CPU threads for decoding; 0 = every usable core (split between engines when parallel > 1)."""
    threads_batch: int = 0
    """CPU threads for prefill; 0 = the same as threads."""
    mmap: bool = True
    """Map the model file instead of reading it; off by itself when tensors are overridden (pinned memory)."""
    n_cpu_moe: int = 0
    """Keep the routed experts of this many layers in CPU memory (--n-cpu-moe), so VRAM goes to KV and batch."""
    cpu_moe: bool = False
    """Keep every layer's routed experts in CPU memory (--cpu-moe)."""
    cpu_moe_from: str = "last"
    """Which n_cpu_moe layers: "first" (llama.cpp's choice) or "last"."""
    override_tensors: str = ""
    """llama.cpp -ot style "regex=BUFFER,..." tensor placements, applied before the expert settings."""
    rope_scaling: str = ""
    """RoPE scaling ("linear" or "yarn") that allows n_ctx above the trained context; empty = none."""
    rope_freq_scale: float = 0.0
    """RoPE frequency scale with rope_scaling; 0 = the model's own."""
    seed: int = 0
    """Sampling seed, so that answers at temperature > 0 are reproducible."""
    n_seq_max: int = 1
    """Sequences one context decodes together (several prompts over one prefix, one decode per step)."""
    tuned: bool = True
    """Use the profile `rag tune` saved for this model and context, for settings left at their defaults."""
    parallel: int = 1
    """Engines (llama.cpp contexts) answering concurrent questions in one process."""

    def validate(self) -> "EngineConfig":
        """Refuse settings llama.cpp cannot run, naming the setting and the cause; return ``self``."""
        for key in ("type_k", "type_v"):
            if getattr(self, key) not in KV_TYPES:
                raise ConfigError(f"engine.{key} must be one of {', '.join(KV_TYPES)}, got {getattr(self, key)!r}")
        if self.type_v not in UNQUANTISED_KV and not self.flash_attn:
            raise ConfigError(f"engine.type_v = {self.type_v!r} is a quantised V cache, which llama.cpp runs only "
                              "with flash attention: set engine.flash_attn = true, or engine.type_v = \"f16\"")
        if self.n_ctx < 0 or self.n_batch < 1 or self.n_ubatch < 1:
            raise ConfigError("engine.n_ctx must be >= 0 (0 = trained context), n_batch and n_ubatch >= 1")
        if self.n_ubatch > self.n_batch:
            raise ConfigError(f"engine.n_ubatch ({self.n_ubatch}) cannot exceed engine.n_batch ({self.n_batch})")
        if self.cpu_moe_from not in ("first", "last"):
            raise ConfigError(f"engine.cpu_moe_from must be 'first' or 'last', got {self.cpu_moe_from!r}")
        if not 1 <= self.parallel <= 64:
            raise ConfigError(f"engine.parallel must be between 1 and 64 (got {self.parallel})")
        if self.rope_scaling not in ("", "none", "linear", "yarn"):
            raise ConfigError(f"engine.rope_scaling must be '', 'linear' or 'yarn', got {self.rope_scaling!r}")
        if self.n_seq_max < 1:
            raise ConfigError(f"engine.n_seq_max must be >= 1, got {self.n_seq_max}")
        if self.n_cpu_moe < 0 or self.threads < 0 or self.threads_batch < 0:
            raise ConfigError("engine.n_cpu_moe, engine.threads and engine.threads_batch must be >= 0")
        return self

    # -- what the settings mean for a model of ``n_layers`` layers (llama.cpp's placement rules) --

    def gpu_layer_set(self, n_layers: int) -> set[int]:
        """Layers llama.cpp puts on the GPU for ``-ngl gpu_layers``: the last ones."""
        k = n_layers + 1 if self.gpu_layers < 0 else self.gpu_layers
        return set(range(max(n_layers - k, 0), n_layers))

    def output_on_gpu(self, n_layers: int) -> bool:
        """Whether the output head is on the GPU (``-ngl`` above the layer count)."""
        return self.gpu_layers < 0 or self.gpu_layers > n_layers

    def cpu_expert_layers(self, n_layers: int) -> list[int]:
        """Layers whose routed experts stay in host memory (``cpu_moe``: all of them)."""
        n = n_layers if self.cpu_moe else min(self.n_cpu_moe, n_layers)
        return list(range(n)) if self.cpu_moe_from == "first" else list(range(n_layers - n, n_layers))

    @property
    def uses_mmap(self) -> bool:
        """Whether the engine maps the file: tensors overridden to the CPU load without mmap, so that a
        GPU build can pin them for fast copies."""
        return self.mmap and not (self.cpu_moe or self.n_cpu_moe or self.override_tensors.strip())

    def as_run(self, n_layers: int, *, gpu: bool) -> "EngineConfig":
        """These settings as the engine runs them on a model of ``n_layers`` layers: batches clamped
        to the context, expert offload in one form (``cpu_moe`` for every layer), mmap as loaded,
        no GPU layers without ``gpu``. Raises :class:`ConfigError` for settings that cannot run.

        ``n_ctx`` must be resolved (not 0) by the caller.
        """
        n_batch = min(self.n_batch, self.n_ctx)
        k = n_layers if self.cpu_moe else min(self.n_cpu_moe, n_layers)
        out = dataclasses.replace(
            self, n_batch=n_batch, n_ubatch=min(self.n_ubatch, n_batch), mmap=self.uses_mmap,
            gpu_layers=self.gpu_layers if gpu else 0, cpu_moe=bool(k) and k == n_layers,
            n_cpu_moe=k if k < n_layers else 0)
        return out.validate()

    def with_planned(self, planned: "EngineConfig") -> "EngineConfig":
        """These settings with the planned keys (:data:`PLANNED_KEYS`) of ``planned``: threads, seed,
        RoPE and ``-ot`` patterns kept."""
        return dataclasses.replace(self, **{k: getattr(planned, k) for k in PLANNED_KEYS})

    def planned_toml(self) -> str:
        """An ``[engine]`` section with the planned keys, for a config file or a tuned profile."""
        return "\n".join(["[engine]", *(f"{k} = {toml_value(getattr(self, k))}" for k in PLANNED_KEYS)]) + "\n"


@dataclass(frozen=True)
class AskConfig:
    """How questions are answered: packing, retrieval breadth and sampling.

    ``mode = "auto"`` packs whole documents when the collection (or the selection) fits
    the context, else the best fixed sections, always in canonical order so that
    questions share their prompt's prefix; ``"passages"`` packs retrieved passages.
    ``reuse_tolerance``: a pack that reuses a cached prefix is chosen over the
    best-scoring one when it holds the question's best section and scores at least
    ``1 - reuse_tolerance`` of it.
    """

    mode: str = "auto"
    """Packing: "auto" = whole documents or fixed sections in document order (reusable); "passages" = hits."""
    reuse_tolerance: float = 0.2
    """A pack reusing a cached prefix wins when it holds the best section and scores >= 1 - this of the best."""
    top_k: int = 8
    """Passages retrieved before neighbour expansion (passages mode); hits cited as sources (auto)."""
    neighbours: int = 1
    """Chunks added on each side of a hit, so a passage or cited page range has its context."""
    mmr: bool = False
    """Diversify passage hits by maximal marginal relevance (passages mode)."""
    mmr_lambda: float = 0.7
    """MMR's weight of relevance against redundancy (1 = relevance only)."""
    max_tokens: int = 256
    """Longest answer in tokens; layouts hold back the larger of this and summarize.max_tokens."""
    temperature: float = 0.0
    """Sampling temperature; 0 = greedy, the same answer every time."""
    repeat_penalty: float = 1.2
    """Penalty on tokens repeated within the last 256; 1.0 = off."""
    system_prompt: str = (
        "You answer questions using only the numbered documents provided. Cite the documents you "
        "use as [1] or, with a page, as [1, p. 3]. If the documents do not contain the answer, say so.")
    """The instruction before the documents; part of every prompt's cached prefix."""


@dataclass(frozen=True)
class SummarizeConfig:
    """Batch summaries (``rag summarize``): the default instruction and how summaries are generated.

    The system prompt is ``ask.system_prompt``, so a summary shares its document prefix
    with ``rag ask --doc`` and ``rag warm``.
    """

    prompt: str = (
        "Summarise the documents for a reader who has not seen them: what they are about, their main "
        "points, and any conclusions, figures or dates that matter, in one or two paragraphs.")
    """The instruction a summary answers when no --prompt is given."""
    max_tokens: int = 384
    """Longest summary (and each partial summary of a map-reduce) in tokens."""
    temperature: float = 0.0
    """Sampling temperature; 0 = greedy, so a resumed job's output equals an uninterrupted one."""
    repeat_penalty: float = 1.2
    """Penalty on tokens repeated within the last 256; 1.0 = off."""


@dataclass(frozen=True)
class CacheConfig:
    """Prefix KV states on disk: prompts that start like an earlier one skip that part of prefill.

    An empty ``path`` means ``$RAG_HOME/cache``. Prefixes shorter than ``min_tokens``
    are not worth a file. Besides a prompt's whole prefix, up to ``boundary_states``
    states are saved at earlier document and section boundaries of it (spread evenly),
    so that a prompt sharing only its first documents or sections resumes from there.
    """

    enabled: bool = True
    """Save and reuse prefix KV states on disk, so a prompt that starts like an earlier one skips that prefill."""
    path: str = ""
    """Directory of the saved states and their index; empty = $RAG_HOME/cache."""
    max_gb: float = 8.0
    """Disk the states may use; least recently used ones are evicted past it."""
    min_tokens: int = 256
    """Prefixes shorter than this are not saved (not worth a file)."""
    boundary_states: int = 4
    """States saved per prompt at earlier document or section boundaries, besides its whole prefix."""


@dataclass(frozen=True)
class RemoteConfig:
    """OpenAI-compatible servers (``models.generator``/``models.embedder = "openai:http://host:port/v1#model"``).

    Timeouts in seconds: ``read_timeout`` is the longest silence a stream may have (a long
    prompt's prefill comes before its first token). Connection errors, timeouts, 429 and 5xx
    are retried with backoff, on the next server where there are several, for at most
    ``max_wait`` seconds in all. ``api_key_env`` names the environment variable holding a
    bearer token (never printed). ``embed_max_tokens`` is the longest embedder input.
    """

    connect_timeout: float = 5.0
    """Seconds to wait for a server connection."""
    read_timeout: float = 300.0
    """Longest silence a stream may have, in seconds (a long prefill comes before the first token)."""
    max_wait: float = 60.0
    """Seconds of retries in all (connection errors, timeouts, 429, 5xx) before giving up with exit status 6."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the servers' bearer token (never printed)."""
    embed_max_tokens: int = 510
    """Longest embedder input in tokens (the embedding server needs n_ubatch >= this + 2)."""


@dataclass(frozen=True)
class Config:
    """All settings. ``home`` empty means ``$RAG_HOME`` or the per-user cache directory."""

    home: str = ""
    """Directory for models, caches and the default store; empty = $RAG_HOME or ~/.cache/rag."""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    """Which embedder and generator to run."""
    ingest: IngestConfig = field(default_factory=IngestConfig)
    """What rag ingest reads."""
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    """How documents are cut into chunks and sections."""
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    """How the embedder runs."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Where vectors, catalog and full-text index live."""
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    """Hybrid search: dense, lexical, fusion, reranking."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The generator in llama.cpp, configured for fast prefill."""
    ask: AskConfig = field(default_factory=AskConfig)
    """How questions are answered: packing, sources, sampling."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """Prefix KV states on disk."""
    summarize: SummarizeConfig = field(default_factory=SummarizeConfig)
    """Batch summaries."""
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """OpenAI-compatible servers for generation and embeddings."""

    @property
    def home_path(self) -> Path:
        return resolve_home(self.home)

    @property
    def cache_path(self) -> Path:
        return Path(self.cache.path).expanduser() if self.cache.path else self.home_path / "cache"

    @property
    def store_path(self) -> Path:
        if self.store.path:
            return Path(self.store.path).expanduser()
        return self.home_path / "store"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved(self) -> "Config":
        """These settings with ``home``, ``store.path`` and ``cache.path`` as the paths that will be used."""
        return dataclasses.replace(
            self, home=str(self.home_path.absolute()),
            store=dataclasses.replace(self.store, path=str(self.store_path.absolute())),
            cache=dataclasses.replace(self.cache, path=str(self.cache_path.absolute())))

    def validate(self) -> "Config":
        _check_values(self)
        if not 0 <= self.ingest.max_file_mb < float("inf"):  # also refuses nan
            raise ConfigError(f"ingest.max_file_mb must be a number >= 0 (0 = no limit), got "
                              f"{self.ingest.max_file_mb}")
        c = self.chunking
        if c.size < 16:
            raise ConfigError(f"chunking.size must be at least 16 tokens, got {c.size}")
        if not 0 <= c.overlap < c.size:
            raise ConfigError(f"chunking.overlap must be between 0 and chunking.size - 1, got {c.overlap}")
        if c.section_tokens < 0:
            raise ConfigError(f"chunking.section_tokens must be >= 0 (0 = from engine.n_ctx), got {c.section_tokens}")
        r = self.remote
        if not (0 < r.connect_timeout < math.inf and 0 < r.read_timeout < math.inf and 0 <= r.max_wait < math.inf):
            raise ConfigError("remote.connect_timeout and remote.read_timeout must be > 0 seconds, "
                              "remote.max_wait >= 0")
        if r.embed_max_tokens < 16:
            raise ConfigError(f"remote.embed_max_tokens must be at least 16, got {r.embed_max_tokens}")
        if self.embed.threads < 0 or self.embed.batch_tokens < 0:
            raise ConfigError("embed.threads and embed.batch_tokens must be >= 0 (0 = automatic)")
        r = self.retrieval
        if r.top_k < 1:
            raise ConfigError(f"retrieval.top_k must be at least 1, got {r.top_k}")
        if not (r.dense or r.lexical):
            raise ConfigError("retrieval.dense and retrieval.lexical cannot both be off")
        if r.candidates < r.top_k:
            raise ConfigError(f"retrieval.candidates ({r.candidates}) must be >= retrieval.top_k ({r.top_k})")
        check_collection_name(self.store.collection)
        if r.rerank not in ("scores", "none"):
            raise ConfigError(f"retrieval.rerank must be 'scores' or 'none', got {r.rerank!r}")
        if r.rerank_normalise not in ("max", "minmax"):
            raise ConfigError(f"retrieval.rerank_normalise must be 'max' or 'minmax', got {r.rerank_normalise!r}")
        if r.rerank_candidates < 1 or not 0.0 <= r.rerank_dense_weight <= 1.0:
            raise ConfigError("retrieval.rerank_candidates must be >= 1 and retrieval.rerank_dense_weight in [0, 1]")
        if r.hyde_tokens < 1:
            raise ConfigError(f"retrieval.hyde_tokens must be at least 1, got {r.hyde_tokens}")
        if self.chunking.doc2query < 0:
            raise ConfigError(f"chunking.doc2query must be 0 (off) or more questions per chunk, got {self.chunking.doc2query}")
        if r.fusion not in ("adaptive", "rrf"):
            raise ConfigError(f"retrieval.fusion must be 'adaptive' or 'rrf', got {r.fusion!r}")
        if not 0.0 <= r.lexical_floor <= r.lexical_full <= 1.0:
            raise ConfigError("retrieval.lexical_floor and lexical_full must satisfy 0 <= floor <= full <= 1, got "
                              f"{r.lexical_floor} and {r.lexical_full}")
        if self.store.wait < 0:
            raise ConfigError("store.wait must be >= 0 seconds")
        if self.store.catalog_pool < 1:
            raise ConfigError("store.catalog_pool must be >= 1 connection")
        check_store_urls(self.store.url, self.store.catalog_url)
        self.engine.validate()
        a = self.ask
        if a.mode not in ASK_MODES:
            raise ConfigError(f"ask.mode must be one of {', '.join(ASK_MODES)}, got {a.mode!r}")
        if not 0.0 <= a.reuse_tolerance <= 1.0:
            raise ConfigError(f"ask.reuse_tolerance must be in [0, 1], got {a.reuse_tolerance}")
        if a.top_k < 1 or a.neighbours < 0 or a.max_tokens < 1:
            raise ConfigError("ask.top_k and ask.max_tokens must be >= 1, ask.neighbours >= 0")
        if not 0.0 <= a.mmr_lambda <= 1.0 or a.temperature < 0 or a.repeat_penalty <= 0:
            raise ConfigError("ask.mmr_lambda must be in [0, 1], ask.temperature >= 0, ask.repeat_penalty > 0")
        if self.cache.max_gb <= 0 or self.cache.min_tokens < 1 or self.cache.boundary_states < 0:
            raise ConfigError("cache.max_gb must be > 0, cache.min_tokens >= 1 and cache.boundary_states >= 0")
        m = self.summarize
        if not m.prompt.strip() or m.max_tokens < 1 or m.temperature < 0 or m.repeat_penalty <= 0:
            raise ConfigError("summarize.prompt must not be empty, summarize.max_tokens >= 1, "
                              "summarize.temperature >= 0, summarize.repeat_penalty > 0")
        return self


KV_TYPES = tuple(KV_TYPE_IDS)
ASK_MODES = ("auto", "passages")


def _check_values(config: Config) -> None:
    """Checks that hold for every setting of a type: floats are finite, integers fit the 32 bits
    llama.cpp's parameters have, strings hold no NUL.

    A NaN passes every range check (each comparison is false) and an infinity passes the
    lower bounds; either breaks the arithmetic later (``int(nan)``, a sampler at ``inf``).
    """
    settings = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            settings += [(f"{f.name}.{g.name}", getattr(value, g.name)) for g in dataclasses.fields(value)]
        else:
            settings.append((f.name, value))
    for key, v in settings:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key} must be a finite number, got {v!r}")
        if isinstance(v, int) and not -2**31 <= v < 2**31:
            raise ConfigError(f"{key} is out of range: {v} (at most {2**31 - 1:,})")
        if isinstance(v, str) and "\0" in v:
            raise ConfigError(f"{key} contains a NUL character")


def resolve_home(home: str = "") -> Path:
    """The directory holding models, caches and (by default) the store."""
    if home:
        return Path(home).expanduser()
    if os.environ.get("RAG_HOME"):
        return Path(os.environ["RAG_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag"


def _sections() -> dict[str, type]:
    return {f.name: f.type for f in dataclasses.fields(Config) if dataclasses.is_dataclass(_resolve(f.type))}


_TYPES = {name: obj for name, obj in globals().items() if isinstance(obj, type)}


def _resolve(t: Any) -> Any:
    return _TYPES.get(t, t) if isinstance(t, str) else t


def _coerce(key: str, value: Any, typ: Any, *, from_text: bool) -> Any:
    typ = _resolve(typ)
    if typ in ("bool", bool):
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in {"1", "true", "yes", "on"}:
            return True
        if from_text and str(value).lower() in {"0", "false", "no", "off"}:
            return False
    elif typ in ("int", int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_text:
            try:
                return int(str(value))
            except ValueError:
                pass
    elif typ in ("float", float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_text:
            try:
                return float(str(value))
            except ValueError:
                pass
    elif typ in ("str", str):
        if isinstance(value, str):
            return value
        if from_text:
            return str(value)
    else:  # pragma: no cover - every field uses one of the types above
        return value
    expected = typ if isinstance(typ, str) else typ.__name__
    raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def _apply(config: Config, values: Mapping[str, Any], *, origin: str, from_text: bool) -> Config:
    """Return ``config`` with dotted-key ``values`` applied, validating every key."""
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for dotted, value in values.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        if not key:
            top[section] = value
        else:
            sections.setdefault(section, {})[key] = value
    changes: dict[str, Any] = {}
    top_fields = {f.name: f for f in dataclasses.fields(Config)}
    for key, value in top.items():
        if key not in top_fields or key in _sections():
            raise ConfigError(f"unknown setting '{key}' in {origin}")
        changes[key] = _coerce(key, value, top_fields[key].type, from_text=from_text)
    for section, items in sections.items():
        if section not in _sections():
            raise ConfigError(f"unknown section '{section}' in {origin}")
        current = getattr(config, section)
        fields = {f.name: f for f in dataclasses.fields(current)}
        updates = {}
        for key, value in items.items():
            if key not in fields:
                raise ConfigError(f"unknown setting '{section}.{key}' in {origin}")
            updates[key] = _coerce(f"{section}.{key}", value, fields[key].type, from_text=from_text)
        changes[section] = dataclasses.replace(current, **updates)
    return dataclasses.replace(config, **changes)


def _flatten(data: Mapping[str, Any], origin: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in _sections():
                raise ConfigError(f"unknown section '{key}' in {origin}")
            for sub, subvalue in value.items():
                if isinstance(subvalue, dict):
                    raise ConfigError(f"unexpected table '{key}.{sub}' in {origin}")
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    return flat


def read_toml(path: Path) -> dict[str, Any]:
    """The dotted-key settings of one TOML file, with a clear error for a missing or malformed file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    return _flatten(data, str(path))


def env_names() -> dict[str, str]:
    """Every ``RAG_SECTION_KEY`` variable that sets something, mapped to its dotted setting."""
    return {f"{ENV_PREFIX}{section}_{f.name}".upper(): f"{section}.{f.name}"
            for section, typ in _sections().items() for f in dataclasses.fields(_resolve(typ))}


def env_settings(environ: Mapping[str, str], *, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """``RAG_SECTION_KEY=value`` variables as dotted keys.

    An unknown key in a known section is an error; a ``RAG_*`` variable that names no
    section is reported to ``warn`` (it may belong to another program), with the likely
    setting when one is close.
    """
    out: dict[str, str] = {}
    sections = _sections()
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _ENV_RESERVED or name.startswith(_ENV_RESERVED_PREFIXES):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        for section in sections:
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1:]
                section_fields = {f.name for f in dataclasses.fields(_resolve(sections[section]))}
                if key not in section_fields:
                    raise ConfigError(f"unknown setting '{section}.{key}' in environment variable {name}")
                out[f"{section}.{key}"] = value
                break
        else:
            if warn is not None:
                warn(_unknown_env_message(name))
    return out


def _unknown_env_message(name: str) -> str:
    names = env_names()
    close = difflib.get_close_matches(name.upper(), [*names, *sorted(_ENV_RESERVED)], n=1, cutoff=0.75)
    hint = ""
    if close:
        hint = f" (did you mean {close[0]}" + (f", setting {names[close[0]]}" if close[0] in names else "") + "?)"
    return f"environment variable {name} matches no setting and is ignored{hint}"


def _warn(message: str) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=4)


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Config:
    """Build the settings: defaults, then ``path`` (or ``$RAG_CONFIG``), then the environment, then ``overrides``.

    ``overrides`` uses dotted keys (``{"store.collection": "papers"}``); ``None`` values are ignored,
    so CLI options that were not given can be passed straight through. Warnings (a ``RAG_*``
    variable that matches no setting) go to ``warn``, by default as a :class:`ConfigWarning`.
    """
    environ = os.environ if environ is None else environ
    config = Config()
    path = path or environ.get("RAG_CONFIG") or None
    if path:
        config = _apply(config, read_toml(Path(path)), origin=str(path), from_text=False)
    config = _apply(config, env_settings(environ, warn=warn or _warn), origin="the environment", from_text=True)
    if overrides:
        config = _apply(config, dict(overrides), origin="the options", from_text=False)
    return config.validate()


def to_toml(config: Config) -> str:
    """TOML text that :func:`load_config` reads back into ``config``."""
    lines: list[str] = []
    data = config.to_dict()
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"\n[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """A TOML literal for a setting's value (bool, number or string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = [
    "Config", "ModelsConfig", "IngestConfig", "ChunkingConfig", "EmbedConfig", "StoreConfig", "RetrievalConfig",
    "EngineConfig", "AskConfig", "CacheConfig", "ConfigWarning", "PLANNED_KEYS",
    "load_config", "read_toml", "env_settings", "env_names", "resolve_home", "to_toml",
]
