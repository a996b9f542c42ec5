"""Text units → chunks sized in tokens of the embedder's own tokenizer.

Chunks never cross a page boundary, so every chunk has one page number, and
never exceed the embedder's maximum sequence length: a piece the recursive
splitter cannot break at a separator is cut on token boundaries instead.

A contextual chunker also gives each chunk a header, its document title and the
heading path in force there (:mod:`.headings`): embedded and BM25-indexed with
the chunk (:attr:`Chunk.indexed_text`), never part of the text shown as a passage.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ..errors import ConfigError
from ..records import Chunk
from .headings import HeadingTrail, context_header
from .text import TextUnit

Tokenize = Callable[[str], Sequence[int]]


class Chunker:
    """Splits text units into chunks of at most ``size`` tokens with ``overlap`` tokens shared."""

    def __init__(self, tokenize: Tokenize, *, size: int, overlap: int, max_tokens: int,
                 contextual: bool = False):
        from langchain_text_splitters import Language, RecursiveCharacterTextSplitter

        if size > max_tokens:
            raise ConfigError(
                f"chunking.size ({size}) is above the embedder's maximum of {max_tokens} tokens")
        self._tokenize = tokenize
        self.size = size
        self.overlap = overlap
        self.max_tokens = max_tokens
        self.contextual = contextual
        self._splitters = {
            fmt: RecursiveCharacterTextSplitter(
                separators=seps, chunk_size=size, chunk_overlap=overlap,
                length_function=self.count, add_start_index=True, strip_whitespace=True,
                is_separator_regex=fmt == "markdown",
            )
            for fmt, seps in {
                "markdown": RecursiveCharacterTextSplitter.get_separators_for_language(Language.MARKDOWN),
                "plain": ["\n\n", "\n", ". ", "; ", ", ", " ", ""],
            }.items()
        }

    def count(self, text: str) -> int:
        return len(self._tokenize(text))

    def split(self, units: Iterable[TextUnit], *, fmt: str = "text", title: str | None = None) -> list[Chunk]:
        """All chunks of one document, in reading order; with ``contextual``, each headed by
        ``title`` and the heading path at its start (the first quarter of it, so a chunk that
        opens with a section's last lines and then starts the next section is headed by the next)."""
        splitter = self._splitters["markdown" if fmt == "markdown" else "plain"]
        chunks: list[Chunk] = []
        trail = HeadingTrail(fmt)
        for unit in units:
            if self.contextual:
                trail.start_unit(unit.text)
            for doc in splitter.create_documents([unit.text]):
                text = doc.page_content
                start = int(doc.metadata.get("start_index", -1))
                if start < 0:
                    start = max(unit.text.find(text), 0)
                for piece, offset in self._enforce_max(text):
                    if not piece.strip():
                        continue
                    context = ""
                    if self.contextual:
                        context = context_header(title, trail.path_at(start + offset + len(piece) // 4))
                    chunks.append(Chunk(text=piece, index=len(chunks), page=unit.page,
                                        start=start + offset, end=start + offset + len(piece),
                                        tokens=self.count(piece), context=context))
        return chunks

    def _enforce_max(self, text: str) -> list[tuple[str, int]]:
        """``text`` cut on token boundaries where it is still longer than the hard maximum."""
        if self.count(text) <= self.max_tokens:
            return [(text, 0)]
        pieces: list[tuple[str, int]] = []
        rest, offset = text, 0
        while rest:
            if self.count(rest) <= self.max_tokens:
                pieces.append((rest, offset))
                break
            # Binary search for the longest prefix that fits: works with any tokenizer.
            lo, hi = 1, len(rest)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.count(rest[:mid]) <= self.size:
                    lo = mid
                else:
                    hi = mid - 1
            cut = rest.rfind(" ", 0, lo)
            cut = lo if cut <= 0 else cut
            pieces.append((rest[:cut], offset))
            offset += cut
            rest = rest[cut:]
        return pieces


def for_embedder(embedder, *, size: int, overlap: int, contextual: bool = False) -> Chunker:
    """A chunker that counts in ``embedder``'s tokens, capped at its maximum sequence length."""
    return Chunker(embedder.tokenize, size=size, overlap=overlap, max_tokens=embedder.max_tokens,
                   contextual=contextual)
