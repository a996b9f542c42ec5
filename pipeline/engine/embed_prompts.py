"""Query and document prefixes for instruction-tuned embedders.

Many retrieval embedders were trained with a fixed text in front of every query, and
often another in front of every passage: e5 wants ``query: `` / ``passage: ``,
nomic-embed ``search_query: `` / ``search_document: ``, bge and mxbai an instruction
before queries only, Qwen3-Embedding an ``Instruct: ...`` line before queries. Without
them the model still runs but retrieves worse than its published figures.

``models.embedder_query_prefix`` and ``models.embedder_document_prefix`` set them;
"auto" (the default) takes the model's own from :data:`KNOWN`, matched against the name
its GGUF file carries (``general.name`` / ``general.basename``, and the architecture),
or for a server embedder the model name it was given. A model that is not known, like
the default all-MiniLM-L6-v2, gets none. :class:`PrefixedEmbedder` applies them: the
document prefix to every chunk at ingest (it changes the vectors, so it is part of the
embedder's identity and a collection refuses vectors embedded without it), the query
prefix to every query.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

AUTO = "auto"

_BGE_QUERY = "Represent this sentence for searching relevant passages: "
_QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


@dataclass(frozen=True)
class Prompts:
    """The texts put before queries and before documents (either may be empty)."""

    query: str = ""
    document: str = ""
    family: str = ""  # the KNOWN entry they came from; "" when set by hand or none is known


#: (family, regular expression searched in the lower-cased model name, query prefix, document prefix),
#: first match wins; prefixes as the models' own cards give them.
KNOWN: tuple[tuple[str, str, str, str], ...] = (
    ("qwen3-embedding", r"qwen3[\s_-]*embedding", _QWEN3_QUERY, ""),
    ("e5-mistral", r"e5[\s_-]*mistral", _QWEN3_QUERY + " ", ""),
    ("nomic-embed", r"nomic[\s_-]*(embed|bert)", "search_query: ", "search_document: "),
    ("e5", r"(^|[^a-z0-9])(multilingual[\s_-]*)?e5([^a-z0-9]|$)", "query: ", "passage: "),
    ("bge", r"(^|[^a-z0-9])bge[\s_-]*(small|base|large)[\s_-]*(en|zh)", _BGE_QUERY, ""),
    ("mxbai-embed", r"mxbai[\s_-]*embed", _BGE_QUERY, ""),
    ("snowflake-arctic-embed-v1", r"arctic[\s_-]*embed(?![\s_-]*[a-z0-9.]*v2)", _BGE_QUERY, ""),
    ("snowflake-arctic-embed-v2", r"arctic[\s_-]*embed.*v2", "query: ", ""),
)


def known_prompts(*names: str) -> Prompts:
    """The prefixes of the first :data:`KNOWN` family any of ``names`` matches; none otherwise."""
    for family, pattern, query, document in KNOWN:
        if any(name and re.search(pattern, name.lower()) for name in names):
            return Prompts(query, document, family)
    return Prompts()


def gguf_names(path: str | Path) -> tuple[str, ...]:
    """The names a GGUF file gives its model: ``general.name``, ``general.basename``, the architecture."""
    from .gguf.header import read_header

    header = read_header(path, tensors=False)
    meta = header.metadata
    return tuple(str(meta[k]) for k in ("general.name", "general.basename", "general.architecture")
                 if isinstance(meta.get(k), str))


def resolve(query: str, document: str, *, names: Sequence[str]) -> Prompts:
    """The prefixes to use: each setting as given, or for "auto" the model's own (from ``names``)."""
    own = known_prompts(*names) if AUTO in (query, document) else Prompts()
    return Prompts(own.query if query == AUTO else query, own.document if document == AUTO else document,
                   own.family if AUTO in (query, document) else "")


class PrefixedEmbedder:
    """An embedder with query and document prefixes (see the module docstring).

    Every chunk goes in through :meth:`sequence` or :meth:`embed` with the document prefix
    in front; :meth:`embed_query` puts the query prefix in front of queries. Chunk sizes are
    still measured on the text alone (:meth:`tokenize`), and :attr:`max_tokens` leaves room
    for the document prefix, so a prefixed chunk is never cut.
    """

    def __init__(self, inner, prompts: Prompts):
        self.inner = inner
        self.prompts = prompts

    @property
    def model_path(self):
        return self.inner.model_path

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def max_tokens(self) -> int:
        extra = len(self.inner.tokenize(self.prompts.document)) if self.prompts.document else 0
        return self.inner.max_tokens - extra

    @property
    def identity(self) -> str:
        """The inner embedder's, plus the document prefix when there is one (it changes every vector)."""
        if not self.prompts.document:
            return self.inner.identity
        return f"{self.inner.identity}+doc:{hashlib.sha256(self.prompts.document.encode()).hexdigest()[:12]}"

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def sequence(self, text: str) -> list[int]:
        return self.inner.sequence(self.prompts.document + text)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Documents (chunks): each with the document prefix."""
        return self.inner.embed([self.prompts.document + t for t in texts])

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        """Queries: each with the query prefix."""
        return self.inner.embed([self.prompts.query + t for t in texts])

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        return self.inner.embed_tokens(seqs)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):  # what else the inner embedder offers (its model, its group size)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"PrefixedEmbedder({self.inner!r}, {self.prompts!r})"


def embed_query(embedder, texts: Sequence[str]) -> np.ndarray:
    """Query vectors from any embedder: through its query prefix when it has one."""
    fn = getattr(embedder, "embed_query", None)
    return fn(texts) if fn is not None else embedder.embed(texts)
