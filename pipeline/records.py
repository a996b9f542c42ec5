"""The records the product's parts hand each other: a chunk as ingest cuts it, a document and its chunks
as the catalog keeps them, a section, a retrieval hit, a passage, a packed prompt, and the prompt as
reuse sees it (:class:`PromptShape`).

Plain data with no behaviour beyond describing itself, so every layer can import it
(ingest writes :class:`Chunk`, the store returns :class:`DocumentRecord` and
:class:`StoredChunk`, retrieval :class:`Hit` and :class:`Passage`, packing builds a
:class:`Prompt` of :class:`PackedSection`) without importing the layer that makes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

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
    shape: PromptShape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """The prompt as reuse sees it, built once with the prompt (what every engine is handed): its
        cuts (the boundaries within its shared prefix) and, for a sections-mode prompt, where its head
        and sections are; whole documents and passages reuse a prefix only."""
        sections = None
        if self.mode == "sections" and self.head > 0 and self.boundaries:
            sections = Sections(self.head, tuple(self.boundaries))
        self.shape = PromptShape.of(self.tokens, prefix_len=len(self.prefix_tokens), boundaries=self.boundaries,
                                    sections=sections)


# -- the prompt as reuse sees it ---------------------------------------------------------------

def cuts(n_tokens: int, prefix_len: int, boundaries: Sequence[int]) -> tuple[int, ...]:
    """A prompt's cuts: the boundaries within its prefix and the prefix's end, one token left to decode."""
    limit = min(prefix_len, n_tokens - 1)
    if limit <= 0:
        return ()
    return tuple(sorted({int(b) for b in boundaries if 0 < b < limit} | {limit}))


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n, limit = 0, min(len(a), len(b), limit)
    while n < limit and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class Piece:
    """A section as a prompt places it: its tokens; which of them are its header (offsets), for the
    ``headers`` seam strategy; and which matter most to the question (offsets, most relevant first),
    for the ``focus`` strategy. Only ``tokens`` identify its state."""

    tokens: tuple[int, ...]
    headers: tuple[int, ...] = ()
    focus: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Sections:
    """Where a sections-mode prompt's sections are: ``tokens[:head]`` is the head, section ``i``
    ends at ``ends[i]`` (the first starts at ``head``; the last end is the documents' end).
    ``headers`` and ``focus`` are, per section, offsets of its header tokens and of the tokens
    most relevant to the question (best first), for the seam strategies that use them."""

    head: int
    ends: tuple[int, ...]
    headers: tuple[tuple[int, ...], ...] = ()
    focus: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        bounds = (self.head, *self.ends)
        if not self.ends or self.head < 1 or any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"sections must follow a head and each other: head {self.head}, ends {self.ends}")

    @property
    def end(self) -> int:
        return self.ends[-1]

    @property
    def starts(self) -> tuple[int, ...]:
        return (self.head, *self.ends[:-1])

    def pieces(self, tokens: Sequence[int]) -> list[Piece]:
        return [Piece(tuple(tokens[a:b]),
                      headers=self.headers[i] if i < len(self.headers) else (),
                      focus=self.focus[i] if i < len(self.focus) else ())
                for i, (a, b) in enumerate(zip(self.starts, self.ends))]


@dataclass(frozen=True)
class PromptShape:
    """One prompt as reuse sees it: ``tokens``, its ``cuts`` (see the module notes) and, for a
    sections-mode prompt, its ``sections`` (None for whole documents and passages)."""

    tokens: tuple[int, ...]
    cuts: tuple[int, ...] = ()
    sections: Sections | None = None

    @classmethod
    def of(cls, tokens: Sequence[int], *, prefix_len: int = 0, boundaries: Sequence[int] = (),
           sections: Sections | None = None) -> PromptShape:
        """The shape of ``tokens`` whose first ``prefix_len`` are shared with other prompts, with
        earlier shared ends at ``boundaries``."""
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, cuts(len(tokens), prefix_len, boundaries), sections)

    @classmethod
    def coerce(cls, prompt: PromptShape | Sequence[int]) -> PromptShape:
        """``prompt`` as a shape: a plain token list shares nothing (no cuts)."""
        return prompt if isinstance(prompt, PromptShape) else cls.of(prompt)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def prefix_len(self) -> int:
        """How many leading tokens other prompts may share (the last cut; 0 with none)."""
        return self.cuts[-1] if self.cuts else 0

    @property
    def prefix(self) -> tuple[int, ...]:
        return self.tokens[:self.prefix_len]


__all__ = ["Chunk", "CollectionInfo", "DocumentRecord", "Hit", "Key", "PackedSection", "Passage", "Piece", "Prompt",
           "PromptShape", "Section", "Sections", "StoredChunk", "common_prefix", "cuts"]
