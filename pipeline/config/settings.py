"""The settings of each ``[table]`` of the settings file: one frozen dataclass per table, each checking its own values.

Every field carries an attribute docstring (the string right after it), which is its
line in the settings reference (``docs/settings.md``, :mod:`pipeline.config.reference`).
The ``[engine]`` table is :mod:`.engine`; :class:`~pipeline.config.Config` holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .ranges import check_section
from ..store.names import check_collection_name
from ..store.vectors import check_store_urls

ASK_MODES = ("auto", "passages")
COMPOSE_MODES = ("auto", "on", "off")  # (pipeline.engine.reuse.budget.ComposeMode)
INGEST_WARM = ("auto", "on", "off")
COMPOSE_SEAMS = ("first", "last", "whole", "none")  # (pipeline.engine.reuse.seams.STRATEGIES a prompt can use)


@dataclass(frozen=True)
class ModelsConfig:
    """Which models to use: ``builtin:NAME``, a path to a ``.gguf`` file, or ``hf:owner/repo/file.gguf``."""

    embedder: str = "builtin:all-MiniLM-L6-v2"
    """The embedding model: builtin:NAME, a .gguf path, hf:owner/repo/file.gguf or openai:URL#model."""
    generator: str = "builtin:gemma-3-270m"
    """The model that writes answers and summaries; the same reference forms as models.embedder."""
    embedder_query_prefix: str = "auto"
    """Text put before every query the embedder sees (e5: "query: "); "auto" = the model's own, "" = none."""
    embedder_document_prefix: str = "auto"
    """Text put before every chunk at ingest (e5: "passage: "); "auto" = the model's own, "" = none."""

    def validate(self) -> "ModelsConfig":
        return self  # any reference is checked when the model is first looked for


@dataclass(frozen=True)
class ChunkingConfig:
    """Chunk and section sizes, in tokens of the embedder's own tokenizer.

    With ``contextual``, each chunk is embedded and BM25-indexed with its document
    title and heading path in front (never shown in passages); changing it needs a
    re-ingest into a fresh collection to take effect on stored chunks. Sections (runs
    of chunks that prompts are built from) are cut once per document version;
    ``section_tokens = 0`` sizes them from the context length (a sixteenth of
    ``engine.n_ctx`` up to 512, so 512 from an 8K context up; a quarter of it up to 4096 with
    ``ask.compose = "auto"``; never below one chunk).
    """

    size: int = 256
    """Chunk length in embedder tokens: the unit that is embedded, BM25-indexed and retrieved."""
    overlap: int = 32
    """Tokens each chunk repeats from the one before, so a sentence cut at a boundary is still found."""
    contextual: bool = True
    """Embed and index each chunk with its title and heading path in front (never shown in passages)."""
    section_tokens: int = 0
    """Section length in embedder tokens (runs of chunks prompts are built from); 0 = n_ctx / 16 up to 512 (n_ctx / 4 up to 4096 when composing)."""
    doc2query: int = 0
    """Questions the generator writes per chunk at ingest, indexed and embedded with it (doc2query); 0 = off (slow)."""

    def validate(self) -> "ChunkingConfig":
        check_section("chunking", self)
        if not self.overlap < self.size:
            raise ConfigError(f"chunking.overlap must be between 0 and chunking.size - 1 ({self.size - 1}), "
                              f"got {self.overlap}")
        return self


@dataclass(frozen=True)
class IngestConfig:
    """What ``rag ingest`` reads, and what it prepares after. Files over ``max_file_mb`` (decompressed,
    for ``.gz``) are skipped and reported; 0 = no limit. ``follow_symlinks`` also follows links that
    leave the folder. ``warm``: see ``Pipeline.warm_auto``."""

    max_file_mb: float = 32.0
    """Files larger than this (decompressed, for .gz) are skipped and reported; 0 = no limit."""
    follow_symlinks: bool = False
    """Also follow symlinks that lead outside the folder being ingested."""
    warm: str = "auto"
    """Then prefill the states questions start from: "auto" (section states, where the collection is larger than the context and the generator can compose), "on" (always, as `rag warm`), "off"."""

    def validate(self) -> "IngestConfig":
        check_section("ingest", self)
        if self.warm not in INGEST_WARM:
            raise ConfigError(f"ingest.warm must be one of {', '.join(INGEST_WARM)}, got {self.warm!r}")
        return self


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

    def validate(self) -> "EmbedConfig":
        check_section("embed", self)
        return self


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
    timeout: float = 30.0
    """Seconds a Chroma server may take per request before the command fails (exit 4), not hangs."""
    url: str = ""
    """A Chroma server (http://host:port) for the vectors, so many processes share them; empty = embedded."""
    catalog_url: str = ""
    """PostgreSQL (postgresql://...) for catalog, full-text index and job state; empty = SQLite in path."""
    catalog_pool: int = 8
    """Most PostgreSQL connections one process keeps open to catalog_url."""

    def validate(self) -> "StoreConfig":
        check_collection_name(self.collection)
        check_section("store", self)
        check_store_urls(self.url, self.catalog_url)
        return self


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
    lexical_sure: float = 0.0
    """Adaptive fusion: below this share of the query's idf weight matched, BM25 counts only while the dense side is unsure; 0 = off."""
    dense_gap_floor: float = 0.04
    """Adaptive fusion: the dense side is unsure while its first hit's similarity leads its fifth's by at most this."""
    dense_gap_full: float = 0.06
    """Adaptive fusion: from this lead of the dense side's first hit over its fifth, a partial BM25 match no longer counts."""
    hyde: bool = False
    """Embed each query with a short answer the generator writes first (HyDE); for a capable generator, one generation a query."""
    hyde_tokens: int = 96
    """Longest hypothetical answer HyDE generates, in generator tokens."""

    def validate(self) -> "RetrievalConfig":
        check_section("retrieval", self)
        if not (self.dense or self.lexical):
            raise ConfigError("retrieval.dense and retrieval.lexical cannot both be off")
        if self.candidates < self.top_k:
            raise ConfigError(f"retrieval.candidates must be at least retrieval.top_k ({self.top_k}), "
                              f"got {self.candidates}")
        if self.rerank not in ("scores", "none"):
            raise ConfigError(f"retrieval.rerank must be 'scores' or 'none', got {self.rerank!r}")
        if self.rerank_normalise not in ("max", "minmax"):
            raise ConfigError(f"retrieval.rerank_normalise must be 'max' or 'minmax', got {self.rerank_normalise!r}")
        if self.fusion not in ("adaptive", "rrf"):
            raise ConfigError(f"retrieval.fusion must be 'adaptive' or 'rrf', got {self.fusion!r}")
        if self.lexical_floor > self.lexical_full:
            raise ConfigError(f"retrieval.lexical_floor must be at most retrieval.lexical_full ({self.lexical_full}), "
                              f"got {self.lexical_floor}")
        if self.dense_gap_floor > self.dense_gap_full:
            raise ConfigError(f"retrieval.dense_gap_floor must be at most retrieval.dense_gap_full "
                              f"({self.dense_gap_full}), got {self.dense_gap_floor}")
        return self


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
    compose: str = "auto"
    """Sections mode, prompts composed from per-section KV states: "auto" (once calibrated within compose_max_kl), "on", "off"."""
    compose_max_kl: float = 0.05
    """The quality budget of "auto": the most mean KL (nats/token) composed may differ from exact by, as measured."""
    compose_recompute: int = 32
    """Tokens of each moved section decoded again at its place when composing (the seam); more = closer to exact."""
    compose_seams: str = "first"
    """Which tokens of a moved section are recomputed: first, last (before the question), whole, none; + joins."""

    def validate(self) -> "AskConfig":
        if self.mode not in ASK_MODES:
            raise ConfigError(f"ask.mode must be one of {', '.join(ASK_MODES)}, got {self.mode!r}")
        check_section("ask", self)
        if self.compose not in COMPOSE_MODES:
            raise ConfigError(f"ask.compose must be one of {', '.join(COMPOSE_MODES)}, got {self.compose!r}")
        if not set(self.compose_seams.split("+")) <= set(COMPOSE_SEAMS):
            raise ConfigError(f"ask.compose_seams must be {', '.join(COMPOSE_SEAMS)} or several joined by +, "
                              f"got {self.compose_seams!r}")
        return self


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

    def validate(self) -> "SummarizeConfig":
        if not self.prompt.strip():
            raise ConfigError("summarize.prompt must not be empty")
        check_section("summarize", self)
        return self


@dataclass(frozen=True)
class CacheConfig:
    """Prefix KV states on disk: prompts that start like an earlier one skip that part of prefill.

    An empty ``path`` means ``$RAG_HOME/cache``. ``max_gb`` 0 sizes the cache from its
    disk: half of its free space plus what the cache already holds, less a margin (the larger
    of 2 GiB and a tenth of the disk), read again at every save; past the cap the least useful
    states go first (used least, longest ago). Section states are kept as ``section_type``
    (``q8_0``: about half the size of ``f16``). Prefixes shorter than ``min_tokens``
    are not worth a file. Besides a prompt's whole prefix, up to ``boundary_states``
    states are saved at earlier document and section boundaries of it (spread evenly),
    so that a prompt sharing only its first documents or sections resumes from there.
    A model that cannot cut its memory (recurrent or hybrid, e.g. Qwen3.6) also keeps the
    last ``ram_states`` boundary states (at most ``ram_gb``) in host memory, so a later
    question in the same process (``rag serve``, an app) restores one without the disk.
    """

    enabled: bool = True
    """Save and reuse prefix KV states on disk, so a prompt that starts like an earlier one skips that prefill."""
    path: str = ""
    """Directory of the saved states and their index; empty = $RAG_HOME/cache."""
    max_gb: float = 0.0
    """Disk the states may use (0: half of what the disk holds for the cache, less a margin); the least useful go first past it."""
    section_type: str = "q8_0"
    """KV type section states are kept in on disk: q8_0 (about half the size of f16) or f16 (as computed)."""
    min_tokens: int = 256
    """Prefixes shorter than this are not saved (not worth a file)."""
    boundary_states: int = 4
    """States saved per prompt at earlier document or section boundaries, besides its whole prefix."""
    ram_states: int = 4
    """Boundary states a recurrent or hybrid model keeps in host memory for later questions (0: none)."""
    ram_gb: float = 2.0
    """Host memory those states may use; least recently used ones go first."""

    def validate(self) -> "CacheConfig":
        check_section("cache", self)
        if self.section_type not in ("f16", "q8_0"):
            raise ConfigError(f"cache.section_type must be \"f16\" or \"q8_0\", got {self.section_type!r}")
        return self


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

    def validate(self) -> "RemoteConfig":
        check_section("remote", self)
        return self


@dataclass(frozen=True)
class ServeConfig:
    """What ``rag serve`` may read and whom it answers. Lists come from TOML arrays, or from a
    ``RAG_SERVE_*`` variable as comma-separated text."""

    allow: tuple[str, ...] = ()
    """Folders POST /ingest may read (paths resolved, symlinks included, relative ones against these); empty = off."""
    allow_hosts: tuple[str, ...] = ()
    """Host names answered besides the address listened on (NAME, NAME:PORT; * = any, behind a checking proxy)."""
    cors_origins: tuple[str, ...] = ()
    """Origins (https://app.example) whose browser pages may call the server (* = any); others are refused."""

    def validate(self) -> "ServeConfig":
        return self  # the folders are resolved (and refused) when a server starts: pipeline.serve.folders


__all__ = ["ASK_MODES", "AskConfig", "CacheConfig", "ChunkingConfig", "EmbedConfig", "IngestConfig", "ModelsConfig",
           "RemoteConfig", "RetrievalConfig", "ServeConfig", "StoreConfig", "SummarizeConfig"]
