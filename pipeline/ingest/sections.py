"""Chunks → sections: each document cut once, at chunk boundaries, into runs of a few thousand tokens.

Sections are what a prompt is built from when the documents do not all fit the
context (see :mod:`pipeline.ask.packing`), so they must not move from question to
question: they are cut when the document is committed and recorded in the catalog
(:mod:`pipeline.store.sections`).

Sizes are in the embedder's tokens, the unit every chunk of a collection is already
measured in. Cutting needs no second model, and a collection keeps its sections when
the generator changes (they depend only on the document and the target). The packer
never trusts these sizes for its budget: it counts each section's rendered text in the
generator's own tokens before placing it. The generator's tokenizer matters only in
the target, which comes from the context length (:func:`target_tokens`): about sixteen
sections fit one prompt whatever the tokenizer's ratio, so a question's best hits in
different places of a shelf larger than the context each find room; where prompts are
composed from section states, about four, so that few seams are recomputed.

Cuts are balanced (a 2,800-token document at a 2,048 target gives two sections of about
1,400, not 2,048 + 752) and, within an eighth of the target of the ideal cut, land
where a page begins, so that sections tend to cover whole pages.
"""

from __future__ import annotations

import bisect
import math
from typing import Protocol, Sequence

from ..records import Section

MAX_TOKENS = 4096
"""The largest section target: bigger sections would make retrieval too coarse at 64K contexts."""

PER_PROMPT = 16
"""Sections a prompt holds at the default size: the share of a 64K context one 4,096-token section takes."""

PER_COMPOSED_PROMPT = 4
"""Sections a composed prompt holds at the default size: each one past the first is a seam recomputed."""


class _ChunkLike(Protocol):
    index: int
    tokens: int
    page: int | None


def target_tokens(n_ctx: int, *, chunk_size: int, composed: bool = False) -> int:
    """The section size for a context of ``n_ctx`` tokens, one chunk to 4,096: a sixteenth of it,
    or a quarter where prompts are ``composed`` from section states.

    With a quarter, an 8K prompt holds three sections and the answer's page is in it for fewer
    questions (0.729 against 0.854 on the man-page development set, ``benchmarks/section_size.py``);
    a composed prompt pays for each extra section with a recomputed seam and a little agreement
    with exact prefill (docs/packing.md, "Composed prompts").
    """
    per_prompt = PER_COMPOSED_PROMPT if composed else PER_PROMPT
    return max(chunk_size, min(MAX_TOKENS, n_ctx // per_prompt))


def cut(source: str, content_hash: str, chunks: Sequence[_ChunkLike], *, target: int) -> list[Section]:
    """The sections of one document whose ``chunks`` are given in order (indexes 0..n-1)."""
    if not chunks:
        return []
    sizes = [max(0, c.tokens) for c in chunks]
    total = sum(sizes)
    n = max(1, math.ceil(total / max(1, target)))
    starts = [0]
    if n > 1:
        # prefix[i] = tokens before chunk i; a cut "at i" starts a section with chunk i.
        prefix = [0]
        for s in sizes:
            prefix.append(prefix[-1] + s)
        slack = max(1, target // 8)
        for k in range(1, n):
            ideal = total * k / n
            lo = starts[-1] + 1
            if lo >= len(chunks):
                break
            # Cuts whose position lies within the slack of the ideal one (prefix is sorted).
            a = max(lo, bisect.bisect_left(prefix, ideal - slack, 0, len(chunks)))
            b = min(len(chunks), bisect.bisect_right(prefix, ideal + slack, 0, len(chunks)))
            options = list(range(a, b))
            page_starts = [i for i in options if chunks[i].page is not None and chunks[i].page != chunks[i - 1].page]
            pool = page_starts or options
            if not pool:  # no boundary near the ideal (a very large chunk): the nearest one after lo
                near = min(max(lo, bisect.bisect_left(prefix, ideal, 0, len(chunks))), len(chunks) - 1)
                pool = [i for i in (near - 1, near) if lo <= i < len(chunks)] or [near]
            starts.append(min(pool, key=lambda i: abs(prefix[i] - ideal)))
    out = []
    for k, first in enumerate(starts):
        last = (starts[k + 1] if k + 1 < len(starts) else len(chunks)) - 1
        pages = [c.page for c in chunks[first:last + 1] if c.page is not None]
        out.append(Section(source, content_hash, k, chunks[first].index, chunks[last].index,
                           min(pages) if pages else None, max(pages) if pages else None,
                           sum(sizes[first:last + 1]), target))
    return out
