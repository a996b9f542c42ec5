"""Passages → a prompt that fits the context, laid out so that prompts share prefixes.

Layout: the system prompt and the numbered documents come first, ordered by
document and position (not by score), and the question comes last. Two
questions over the same passages therefore share every token up to the
question, which the engine's prefix reuse (and the prefix cache) turns into
skipped prefill. Passages are whole: when they do not all fit, the lowest-ranked
ones are dropped; only a single passage larger than the whole budget is cut, at a
sentence boundary, and the result says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .errors import EngineError
from .retrieve import Passage

_SENTINEL = "\x00QUESTION\x00"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class Prompt:
    """A packed prompt: ``prefix`` (system + documents) and ``suffix`` (question + answer header)."""

    prefix: str
    suffix: str
    passages: list[Passage]
    dropped: int = 0
    truncated: bool = False
    prefix_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def sources(self) -> list[dict]:
        """The numbered sources, as cited in the prompt."""
        return [{"n": i, "source": p.source, "pages": list(p.pages), "chunks": [p.first, p.last]}
                for i, p in enumerate(self.passages, start=1)]


def label(source: str) -> str:
    return Path(source).name


def render_passage(n: int, passage: Passage) -> str:
    where = label(passage.source) + (f", {passage.page_label}" if passage.pages else "")
    return f"[{n}] {where}\n{passage.text}\n\n"


def _cut_at_sentence(text: str, fits: Callable[[str], bool]) -> str:
    """The longest run of whole sentences from the start of ``text`` that ``fits``."""
    ends = [m.start() for m in _SENTENCE_END.finditer(text)] + [len(text)]
    lo, hi, best = 0, len(ends) - 1, ""
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = text[:ends[mid]]
        if fits(candidate):
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best


def pack(passages: Sequence[Passage], question: str, *, chat: Callable[[str, str], str],
         tokenize: Callable[[str], list[int]], bos: Sequence[int], n_ctx: int, reserve: int,
         system: str) -> Prompt:
    """The prompt for ``question`` over as many of ``passages`` (best rank first) as fit.

    ``reserve`` tokens are left for the answer; the result never exceeds ``n_ctx``.
    """
    rendered = chat(system, "Documents:\n\n" + _SENTINEL)
    head, _, tail = rendered.partition(_SENTINEL)
    suffix = f"Question: {question}" + tail
    fixed = len(bos) + len(tokenize(head)) + len(tokenize(suffix))
    budget = n_ctx - reserve - fixed
    if budget <= 0:
        raise EngineError(f"the context ({n_ctx:,} tokens) has no room for documents after the question "
                          f"and {reserve} answer tokens: raise engine.n_ctx or lower ask.max_tokens")

    by_rank = sorted(passages, key=lambda p: (p.rank, p.source, p.first))
    chosen: list[Passage] = []
    used = 0
    truncated = False
    for p in by_rank:
        cost = len(tokenize(render_passage(0, p)))
        if used + cost <= budget:
            chosen.append(p)
            used += cost
    if not chosen and by_rank:
        top = by_rank[0]
        text = _cut_at_sentence(
            top.text, lambda t: len(tokenize(render_passage(0, _with_text(top, t + " […]")))) <= budget)
        if text:
            chosen.append(_with_text(top, text + " […]"))
            truncated = True

    while True:
        ordered = sorted(chosen, key=lambda p: (p.source, p.first))
        prefix = head + "".join(render_passage(i, p) for i, p in enumerate(ordered, start=1))
        prefix_tokens = list(bos) + tokenize(prefix)
        tokens = prefix_tokens + tokenize(suffix)
        # Token counts of parts can differ slightly from the whole; drop the worst until it fits.
        if len(tokens) + reserve <= n_ctx or not chosen:
            break
        chosen.remove(max(chosen, key=lambda p: (p.rank, p.source, p.first)))
    if len(tokens) + reserve > n_ctx:
        raise EngineError(f"the question alone needs {len(tokens):,} tokens, more than the context allows")
    return Prompt(prefix=prefix, suffix=suffix, passages=ordered, dropped=len(passages) - len(ordered),
                  truncated=truncated, prefix_tokens=prefix_tokens, tokens=tokens)


def _with_text(p: Passage, text: str) -> Passage:
    return Passage(p.source, p.content_hash, p.first, p.last, p.pages, text, p.rank)
