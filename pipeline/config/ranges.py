"""The range of every numeric setting: one table, checked by each section and shown in the settings reference.

Every number a person can set has a lower and an upper bound. The upper bounds lie far
beyond any machine (a petabyte of prefix cache, a day of timeout) yet below what the
arithmetic behind them survives: ``cache.max_gb`` becomes bytes (``int(1e300 * 2**30)``
overflows), a timeout reaches ``socket.create_connection`` (which refuses 1e10 seconds),
a file size limit becomes the size of a read. A value outside its range is a
:class:`~pipeline.errors.ConfigError` that names the one key and the value it got.
Relations between settings (``chunking.overlap`` below ``chunking.size``, ``engine.n_ubatch``
at most ``engine.n_batch``) are each section's own ``validate``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

#: Tokens no context, prompt or section of any model comes near (16M).
MAX_TOKENS = 1 << 24
#: The most threads ggml runs one computation with (``GGML_MAX_N_THREADS``).
MAX_THREADS = 512


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``low < value`` with ``open_low``), in ``unit``; ``note`` says what the
    edge values mean (``0 = no limit``)."""

    low: float
    high: float
    unit: str = ""
    open_low: bool = False
    note: str = ""

    def holds(self, value: float) -> bool:
        return (self.low < value if self.open_low else self.low <= value) and value <= self.high

    def describe(self) -> str:
        """``between 0 and 1,048,576 MB (0 = no limit)``, ``> 0 and at most 3,600 s``."""
        unit = f" {self.unit}" if self.unit else ""
        low, high = _number(self.low), _number(self.high)
        text = f"> {low} and at most {high}{unit}" if self.open_low else f"between {low} and {high}{unit}"
        return text + (f" ({self.note})" if self.note else "")

    def check(self, key: str, value: float) -> None:
        if not self.holds(value):
            raise ConfigError(f"{key} must be {self.describe()}, got {value!r}")


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


GB, MB, S, TOKENS = "GB", "MB", "s", "tokens"

RANGES: dict[str, Range] = {
    "ingest.max_file_mb": Range(0, 1 << 20, MB, note="0 = no limit"),
    "chunking.size": Range(16, 1 << 16, TOKENS),
    "chunking.overlap": Range(0, (1 << 16) - 1, TOKENS),
    "chunking.section_tokens": Range(0, 1 << 20, TOKENS, note="0 = from engine.n_ctx"),
    "chunking.doc2query": Range(0, 64, "questions per chunk", note="0 = off"),
    "embed.threads": Range(0, MAX_THREADS, note="0 = automatic; ggml's limit"),
    "embed.gpu_layers": Range(-1, 100_000, note="-1 = all"),
    "embed.batch_tokens": Range(0, 1 << 20, TOKENS, note="0 = automatic"),
    "store.wait": Range(0, 86_400, S),
    "store.timeout": Range(0, 3_600, S, open_low=True),
    "store.catalog_pool": Range(1, 1_024, "connections"),
    "retrieval.top_k": Range(1, 1_000),
    "retrieval.candidates": Range(1, 100_000),
    "retrieval.rrf_k": Range(0, 1_000_000),
    "retrieval.rerank_candidates": Range(1, 100_000),
    "retrieval.rerank_dense_weight": Range(0, 1),
    "retrieval.lexical_floor": Range(0, 1),
    "retrieval.lexical_full": Range(0, 1),
    "retrieval.lexical_sure": Range(0, 1, note="0 = off"),
    "retrieval.dense_gap_floor": Range(0, 2),
    "retrieval.dense_gap_full": Range(0, 2),
    "retrieval.hyde_tokens": Range(1, 1 << 16, TOKENS),
    "engine.n_ctx": Range(0, MAX_TOKENS, TOKENS, note="0 = the trained context"),
    "engine.n_batch": Range(1, MAX_TOKENS, TOKENS),
    "engine.n_ubatch": Range(1, MAX_TOKENS, TOKENS),
    "engine.gpu_layers": Range(-1, 100_000, note="-1 = all"),
    "engine.threads": Range(0, MAX_THREADS, note="0 = every usable core; ggml's limit"),
    "engine.threads_batch": Range(0, MAX_THREADS, note="0 = engine.threads; ggml's limit"),
    "engine.n_cpu_moe": Range(0, 100_000, "layers"),
    "engine.rope_freq_scale": Range(0, 1_000, note="0 = the model's own"),
    "engine.seed": Range(-(1 << 31), (1 << 31) - 1),
    "engine.n_seq_max": Range(1, 64, "sequences"),
    "engine.parallel": Range(1, 64, "engines"),
    "ask.reuse_tolerance": Range(0, 1),
    "ask.top_k": Range(1, 1_000),
    "ask.neighbours": Range(0, 100, "chunks"),
    "ask.mmr_lambda": Range(0, 1),
    "ask.max_tokens": Range(1, 1 << 20, TOKENS),
    "ask.temperature": Range(0, 100, note="0 = greedy"),
    "ask.repeat_penalty": Range(0, 100, open_low=True, note="1 = off"),
    "ask.compose_max_kl": Range(0, 100, "nats per token"),
    "ask.compose_recompute": Range(0, 1 << 20, TOKENS),
    "summarize.max_tokens": Range(1, 1 << 20, TOKENS),
    "summarize.temperature": Range(0, 100, note="0 = greedy"),
    "summarize.repeat_penalty": Range(0, 100, open_low=True, note="1 = off"),
    "cache.max_gb": Range(0, 1 << 20, GB, note="0 = a share of the disk"),
    "cache.min_tokens": Range(1, MAX_TOKENS, TOKENS),
    "cache.boundary_states": Range(0, 1_024),
    "cache.ram_states": Range(0, 1_024, note="0 = none"),
    "cache.ram_gb": Range(0, 1 << 16, GB),
    "remote.connect_timeout": Range(0, 3_600, S, open_low=True),
    "remote.read_timeout": Range(0, 86_400, S, open_low=True),
    "remote.max_wait": Range(0, 86_400, S),
    "remote.embed_max_tokens": Range(16, 1 << 20, TOKENS),
}


def check_section(section: str, values: object) -> None:
    """Refuse the first numeric field of ``values`` (the ``[section]`` dataclass) outside its range."""
    import dataclasses

    for f in dataclasses.fields(values):  # type: ignore[arg-type]
        value = getattr(values, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            limits = RANGES.get(f"{section}.{f.name}")
            if limits is not None:
                limits.check(f"{section}.{f.name}", value)


__all__ = ["MAX_THREADS", "MAX_TOKENS", "RANGES", "Range", "check_section"]
