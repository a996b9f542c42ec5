"""Chunks → sections: each document cut once, at chunk boundaries, into runs of a few thousand tokens.

Sections are what a prompt is built from when the documents do not all fit the
context (see :mod:`pipeline.ask.packing`), so they must not move from question to
question: they are cut when the document is committed and recorded in the catalog
(:mod:`pipeline.store.sections`).

Sizes are in the embedder's tokens, the unit every chunk of a collection is already
measured in. Cutting needs no second model, and a collection keeps its sections when
the generator changes (they depend only on the document and the target). The packer
never trusts these sizes for its budget: it counts each section's rendered text in the
generator's own tokens before placing it. The default target (:func:`target_tokens`) is small,
512 tokens from an 8K context up, so that a question's best hits in different places of a
shelf larger than the context each find room; where prompts are composed from section states
it is a quarter of the context, so that few seams are recomputed.

Cuts are balanced (a 2,800-token document at a 2,048 target gives two sections of about
1,400, not 2,048 + 752) and, within an eighth of the target of the ideal cut, land
where a page begins, so that sections tend to cover whole pages.
"""

from __future__ import annotations

import bisect
import math
from typing import Mapping, Protocol, Sequence

from ..records import Section

MAX_TOKENS = 512
"""The largest default section where prompts are prefilled exactly (not composed): small sections
let a question's hits in many places each find room, and adjacent chosen sections still read as
one run of text."""

MAX_COMPOSED_TOKENS = 4096
"""The largest default section where prompts are composed from section states."""

PER_PROMPT = 16
"""Sections a prompt holds at least, at the default size, in contexts under 8K."""

PER_COMPOSED_PROMPT = 4
"""Sections a composed prompt holds at the default size: each one past the first is a seam recomputed."""


class _ChunkLike(Protocol):
    index: int
    tokens: int
    page: int | None


def target_tokens(n_ctx: int, *, chunk_size: int, composed: bool = False) -> int:
    """The section size for a context of ``n_ctx`` tokens: a sixteenth of it up to 512 tokens (two
    chunks), whatever the context above 8K; where prompts may be ``composed`` from section states, a
    quarter of it in contexts up to 16K (4,096 tokens at most: four sections a prompt). Never below
    one chunk.

    The answer's page is in the prompt more often the more sections the prompt holds, at every
    context measured: on the man-page development shelf (29 tools, ten times a 64K context) 0.771 /
    0.875 / 0.896 / 0.958 at 32K with 4,096 / 2,048 / 1,024 / 512-token sections, 0.917 against
    0.958 at 64K with 4,096 against 512 (``benchmarks/section_size.py``). A composed prompt pays for
    each extra section with a recomputed seam and a little agreement with exact prefill
    (docs/packing.md, "Composed prompts"), so it keeps few large ones where its context is small. In
    larger contexts a prompt would hold many seams even of the largest sections, which the quality
    budget of ``ask.compose = "auto"`` then refuses, while retrieval loses the answer's page more
    often: there the exact default stands.
    """
    if composed and n_ctx // PER_COMPOSED_PROMPT <= MAX_COMPOSED_TOKENS:
        return max(chunk_size, n_ctx // PER_COMPOSED_PROMPT)
    return max(chunk_size, min(MAX_TOKENS, n_ctx // PER_PROMPT))


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


def record_cut(store, cut_now: Mapping[str, Sequence[Section]]) -> None:
    """Record in ``store``'s catalog sections cut after their documents were committed (a catalog older
    than sections: packing cuts them when it reads, see :func:`pipeline.ask.packing.gather`), so the next
    read finds them there. Each document's are written only while it is still that version; a store that
    cannot be written keeps none, and the sections already cut serve all the same."""
    for sections in cut_now.values():
        store.catalog.backfill_sections(store.name, list(sections))
