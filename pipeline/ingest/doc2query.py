"""doc2query, off by default (``chunking.doc2query``): at ingest the generator writes the questions
each chunk answers; they join the chunk's header (embedded and BM25-indexed with it, never shown),
so a user's wording meets the questions' wording. One generation per chunk: slow, and it needs a
re-ingest into a fresh collection to reach chunks already stored (see docs/retrieval.md for what
it measured).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from ..engine.oneshot import generate_text

DOC2QUERY_SYSTEM = "You read a passage of a manual and write the questions a user would ask that it answers."

_NUMBERING = re.compile(r"^\s*(?:[-*•]|\d+[.)]|q\d*[:.)])\s*", re.I)


def questions_for(engine: Any, text: str, *, n: int, max_tokens: int) -> list[str]:
    """Up to ``n`` questions the passage ``text`` answers (doc2query), one per line of the answer."""
    answer = generate_text(engine, DOC2QUERY_SYSTEM,
                           f"Passage:\n{text}\n\nWrite {n} different questions it answers, one per line.",
                           max_tokens=max_tokens)
    out: list[str] = []
    for line in answer.splitlines():
        line = _NUMBERING.sub("", line).strip()
        if len(line) > 8 and line not in out:
            out.append(line)
    return out[:n]


class Doc2QueryChunker:
    """A chunker whose chunks carry, in their header, the questions the generator wrote for them."""

    def __init__(self, inner: Any, engine: Any, *, n: int, max_tokens: int = 96):
        self.inner = inner
        self.engine = engine
        self.n = n
        self.max_tokens = max_tokens

    def split(self, units: Sequence[Any], **kwargs: Any) -> list:
        chunks = self.inner.split(units, **kwargs)
        out = []
        for chunk in chunks:
            asked = questions_for(self.engine, chunk.text, n=self.n, max_tokens=self.max_tokens)
            if asked:
                head = f"{chunk.context}\n" if chunk.context else ""
                chunk = dataclasses.replace(chunk, context=head + "\n".join(asked))
            out.append(chunk)
        return out

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
