"""The records the product's parts hand each other: a chunk as ingest cuts it, a document and its chunks
as the catalog keeps them, a section, a retrieval hit, a passage, a packed prompt.

Plain data with no behaviour beyond describing itself, so every layer can import it
(ingest writes :class:`Chunk`, the store returns :class:`DocumentRecord` and
:class:`StoredChunk`, retrieval :class:`Hit` and :class:`Passage`, packing builds a
:class:`Prompt` of :class:`PackedSection`) without importing the layer that makes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

Key = tuple[str, str, int]
"""What identifies a section's text: (source, content hash, section index)."""


@dataclass(frozen=True)
class Chunk:
    """One piece of a document as it is embedded and stored."""

    text: str
    index: int  # position in the document, from 0
    page: int | None
    start: int  # character offsets in the page's (or document's) text
    end: int
    tokens: int  # of ``text``: what passages cost in a prompt
    context: str = ""  # title and heading path; indexed, never shown

    @property
    def indexed_text(self) -> str:
        """What the embedder and the lexical index see: the header, then the text."""
        return f"{self.context}\n\n{self.text}" if self.context else self.text


@dataclass(frozen=True)
class DocumentRecord:
    """A committed document as the catalog knows it."""

    source: str
    content_hash: str
    size: int
    mtime_ns: int
    format: str
    title: str | None = None
    pages: int | None = None
    n_chunks: int = 0
    n_tokens: int = 0
    ingested_at: float = 0.0


@dataclass(frozen=True)
class StoredChunk:
    """A chunk of a committed document, as stored on either side."""

    chunk_id: str
    source: str
    content_hash: str
    index: int
    page: int | None
    start: int
    end: int
    tokens: int
    text: str


@dataclass(frozen=True)
class CollectionInfo:
    """A collection's fixed facts: the embedder its vectors come from and how its chunks were cut."""

    name: str
    embedder: str
    embedder_id: str
    dim: int
    chunk_size: int
    chunk_overlap: int
    created_at: float


@dataclass(frozen=True)
class Section:
    """A fixed run of one document's chunks (``first``..``last``, inclusive): the unit a prompt is built
    from, cut once per document version (see :mod:`pipeline.ingest.sections`)."""

    source: str
    content_hash: str
    index: int
    first: int
    last: int
    first_page: int | None
    last_page: int | None
    tokens: int  # embedder tokens of its chunks (overlaps counted in both neighbours)
    target: int  # the section size it was cut to

    @property
    def key(self) -> Key:
        """What identifies the section's text: the document, its version, the position."""
        return (self.source, self.content_hash, self.index)

    @property
    def pages(self) -> tuple[int, ...]:
        if self.first_page is None:
            return ()
        return (self.first_page,) if self.last_page in (None, self.first_page) else (self.first_page,
                                                                                      self.last_page)


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk. ``found_by`` names the sides that returned it."""

    source: str
    page: int | None
    score: float
    text: str
    found_by: tuple[str, ...]
    chunk_id: str
    index: int
    content_hash: str
    dense_rank: int | None = None
    dense_similarity: float | None = None
    lexical_rank: int | None = None
    bm25: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["found_by"] = list(self.found_by)
        return d


@dataclass(frozen=True)
class Passage:
    """Consecutive chunks of one document, merged without repeating their overlaps."""

    source: str
    content_hash: str
    first: int  # chunk indexes, inclusive
    last: int
    pages: tuple[int, ...]
    text: str
    rank: int  # best (lowest) rank of the hits inside it, from 0

    @property
    def page_label(self) -> str:
        if not self.pages:
            return ""
        lo, hi = min(self.pages), max(self.pages)
        return f"page {lo}" if lo == hi else f"pages {lo}-{hi}"


@dataclass(frozen=True)
class PackedSection:
    """A section as placed in a prompt: its document's number there and its rendered tokens."""

    n: int
    section: Section
    of: int  # sections in its document
    tokens: tuple[int, ...]

    def to_dict(self) -> dict:
        s = self.section
        return {"n": self.n, "source": s.source, "section": s.index, "of": self.of,
                "pages": list(s.pages), "tokens": len(self.tokens)}


@dataclass
class Prompt:
    """A packed prompt: ``prefix`` (head + documents) and ``suffix`` (question + tail).

    ``boundaries`` are the positions (in ``tokens``) where each document part ends;
    the last is ``len(prefix_tokens)``. ``mode`` is "passages", "whole" (every document
    of the selection, whole) or "sections" (chosen sections); ``head`` is how many tokens
    come before the first document part (the template's head and the system prompt).
    ``sources`` are numbered from 1 as shown to people; ``citations`` maps the numbers the
    prompt gives its documents to those (see :mod:`pipeline.ask.citations`).
    """

    prefix: str
    suffix: str
    passages: list[Passage] = field(default_factory=list)
    dropped: int = 0
    truncated: bool = False
    prefix_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)
    mode: str = "passages"
    sections: list[PackedSection] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)
    head: int = 0
    citations: dict[int, int] = field(default_factory=dict)  # the prompt's document numbers -> the sources'


__all__ = ["Chunk", "CollectionInfo", "DocumentRecord", "Hit", "Key", "PackedSection", "Passage", "Prompt",
           "Section", "StoredChunk"]
