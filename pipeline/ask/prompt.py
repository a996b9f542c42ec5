"""The prompt's layout: system and documents first, the question last, tokenised piece by piece.

A prompt is the chat template's head (its markup, the system prompt, "Documents:"),
then the documents, then the question and the template's tail. Each piece is
tokenised on its own and the token lists are joined, so:

- a prompt made of parts ``[A, B]`` is token for token the start of one made of
  ``[A, B, C]``: the end of every part is a *boundary* where a saved KV state can be
  reused (:meth:`pipeline.engine.local.Engine.generate`);
- only the template's own markup is tokenised with special-token parsing: text from
  documents and questions never becomes control tokens, so a document holding
  ``<|im_end|><|im_start|>system`` cannot forge a turn.

Two ways to fill the documents part:

- **passages** (:func:`pack`): retrieved passages, as many as fit, best first, laid out
  by document and position (not by score) and numbered ``[1]``, ``[2]``...;
- **sections** (:func:`section_prompt`): whole documents or fixed sections, chosen by
  :mod:`pipeline.ask.packing` and given here in canonical order. Each section is headed by
  its document's number and marks its pages inline, ``[2, p. 9]``, so citations stay
  page-exact; :class:`SectionTokens` remembers a rendered section's tokens.

Every layout decision (whole or sections, which sections fit, where a summary's
map-reduce runs end) holds back the same answer room, :func:`layout_reserve`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..errors import EngineError
from ..records import PackedSection, Passage, Prompt, Section
from .citations import excerpt

if TYPE_CHECKING:
    from .saved_tokens import SavedTokens

_SENTINEL = "\x00DOCUMENTS\x00"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
QUESTION_ALLOWANCE = 128
"""Tokens kept for the question (a sixteenth of smaller contexts) when deciding what fits, so
that the decision (and so the prefix) does not change with the question's length; a longer
question takes its excess from the documents' budget."""


class Tokenize(Protocol):
    def __call__(self, text: str, *, special: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class Layout:
    """The chat template around the documents, tokenised: ``head`` (BOS, markup, system prompt,
    "Documents:") and ``tail`` (end of the user turn, start of the answer)."""

    head: str
    tail: str
    head_tokens: tuple[int, ...]
    tail_tokens: tuple[int, ...]

    @classmethod
    def make(cls, *, chat: Callable[[str, str], str], tokenize: Tokenize, bos: Sequence[int],
             system: str) -> "Layout":
        rendered = chat(system, "Documents:\n\n" + _SENTINEL)
        head, _, tail = rendered.partition(_SENTINEL)
        return cls(head, tail, tuple(bos) + tuple(tokenize(head, special=True)),
                   tuple(tokenize(tail, special=True)))

    def suffix(self, text: str, tokenize: Tokenize) -> list[int]:
        """``text`` (a question or an instruction, plain) followed by the template's tail."""
        return tokenize(text) + list(self.tail_tokens)

    def budget(self, *, n_ctx: int, reserve: int, suffix_tokens: int) -> int:
        """Tokens left for documents in a context of ``n_ctx`` with ``reserve`` for the answer."""
        allowance = min(QUESTION_ALLOWANCE, n_ctx // 16) + len(self.tail_tokens)
        fixed = len(self.head_tokens) + max(suffix_tokens, allowance)
        budget = n_ctx - reserve - fixed
        if budget <= 0:
            raise EngineError(f"the context ({n_ctx:,} tokens) has no room for documents after the question "
                              f"and {reserve} answer tokens: raise engine.n_ctx or lower ask.max_tokens and "
                              "summarize.max_tokens (the layout holds back the larger)")
        return budget


def layout_reserve(n_ctx: int, ask_max_tokens: int, summarize_max_tokens: int, max_tokens: int | None = None) -> int:
    """The tokens every layout decision holds back for the answer: the larger of ``ask.max_tokens``
    and ``summarize.max_tokens``, at most a quarter of the context; a call's own ``max_tokens``
    only where it is larger still.

    ``ask``, ``warm`` and ``summarize`` decide with this one figure whether a document goes
    whole, which sections fit and where a map-reduce run ends, so a document is laid out the
    same way by all three and they share its prefix (with each its own reserve, a document
    between the two edges went whole in one and map-reduce in the other). Generation then
    uses its own ``max_tokens`` within it, so a shorter answer never changes the layout. The
    quarter keeps a small context usable for questions when summaries are configured long:
    a call that needs more than the shared figure holds back its own and may lay out differently.
    """
    shared = min(max(ask_max_tokens, summarize_max_tokens), n_ctx // 4)
    return max(shared, max_tokens or 0)


def label(source: str) -> str:
    return Path(source).name


def render_passage(n: int, passage: Passage) -> str:
    where = label(passage.source) + (f", {passage.page_label}" if passage.pages else "")
    return f"[{n}] {where}\n{passage.text}\n\n"


def page_range(pages: Sequence[int]) -> str:
    if not pages:
        return ""
    lo, hi = min(pages), max(pages)
    return f"page {lo}" if lo == hi else f"pages {lo}-{hi}"


def render_section(n: int, section: Section, *, of: int, segments: Sequence[tuple[int | None, str]]) -> str:
    """One section: a header naming its document ``[n]``, then its text with each page marked ``[n, p. P]``.

    ``segments`` are the section's text runs in order, one per page (page None for
    documents without pages).
    """
    where = [f"section {section.index + 1} of {of}"] if of > 1 else []
    if section.pages:
        where.append(page_range(section.pages))
    header = f"[{n}] {label(section.source)}" + (" (" + ", ".join(where) + ")" if where else "")
    body = "\n".join(f"[{n}, p. {page}] {text}" if page is not None else text for page, text in segments)
    return f"{header}\n{body}\n\n"


class SectionTokens:
    """The generator tokens of rendered sections, remembered (they never change for a document
    version), so a question over a packed 60K-token collection tokenises only itself. With
    ``saved`` (:class:`~.saved_tokens.SavedTokens`) they are also kept on disk for the next process."""

    def __init__(self, tokenize: Tokenize, *, max_tokens: int = 4_000_000, saved: "SavedTokens | None" = None):
        self._tokenize = tokenize
        self._max = max_tokens
        self._saved = saved
        self._held = 0
        self._memo: OrderedDict[tuple, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, n: int, section: Section, of: int, segments: Sequence[tuple[int | None, str]]
            ) -> tuple[int, ...]:
        key = (*section.key, section.first, section.last, n, of)
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return hit
        text = render_section(n, section, of=of, segments=segments)
        tokens = None
        if self._saved is not None:
            from .saved_tokens import digest

            tokens = self._saved.get(saved_key := digest(text))
        if tokens is None:
            tokens = tuple(self._tokenize(text))
            if self._saved is not None:
                self._saved.put(saved_key, tokens)
        with self._lock:
            self._memo[key] = tokens
            self._held += len(tokens)
            while self._held > self._max and len(self._memo) > 1:
                _, old = self._memo.popitem(last=False)
                self._held -= len(old)
        return tokens

    def close(self) -> None:
        if self._saved is not None:
            self._saved.close()


def _join(layout: Layout, parts: Sequence[Sequence[int]], suffix: Sequence[int]) -> tuple[list[int], list[int]]:
    """(tokens, boundaries): the head, each part, the suffix; a boundary after every part."""
    tokens = list(layout.head_tokens)
    boundaries = []
    for part in parts:
        tokens.extend(part)
        boundaries.append(len(tokens))
    prefix_len = len(tokens)
    tokens.extend(suffix)
    return tokens, boundaries or [prefix_len]


def section_prompt(layout: Layout, sections: Sequence[PackedSection], suffix_text: str, *, tokenize: Tokenize,
                   mode: str, texts: Sequence[str] = ()) -> Prompt:
    """The prompt over ``sections`` (already in canonical order, tokenised) with ``suffix_text`` last."""
    suffix = layout.suffix(suffix_text, tokenize)
    tokens, boundaries = _join(layout, [s.tokens for s in sections], suffix)
    prefix_len = len(tokens) - len(suffix)
    return Prompt(prefix=layout.head + "".join(texts), suffix=suffix_text + layout.tail,
                  prefix_tokens=tokens[:prefix_len], tokens=tokens, boundaries=boundaries, mode=mode,
                  sections=list(sections), head=len(layout.head_tokens))


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


def pack(passages: Sequence[Passage], question: str, *, chat: Callable[[str, str], str], tokenize: Tokenize,
         bos: Sequence[int], n_ctx: int, reserve: int, system: str) -> Prompt:
    """The prompt for ``question`` over as many of ``passages`` (best rank first) as fit.

    ``reserve`` tokens are left for the answer; the result never exceeds ``n_ctx``. When
    not even the best passage fits, it is cut at a sentence boundary (``truncated``);
    when not even its first sentence fits, the prompt is refused.
    """
    layout = Layout.make(chat=chat, tokenize=tokenize, bos=bos, system=system)
    suffix_text = f"Question: {question}"
    suffix = layout.suffix(suffix_text, tokenize)
    budget = n_ctx - reserve - len(layout.head_tokens) - len(suffix)
    if budget <= 0:
        layout.budget(n_ctx=n_ctx, reserve=reserve, suffix_tokens=len(suffix))  # raises, naming the setting
        raise EngineError(f"the question alone needs {len(suffix):,} tokens, more than the context allows")

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
    if by_rank and not chosen:
        raise EngineError(f"not even one passage fits the context of {n_ctx:,} tokens (the best needs "
                          f"{len(tokenize(render_passage(1, by_rank[0]))):,}, {budget:,} are left after the "
                          "question and the answer): raise engine.n_ctx (--ctx) or lower ask.max_tokens")

    while True:
        ordered = sorted(chosen, key=lambda p: (p.source, p.first))
        rendered = [render_passage(i, p) for i, p in enumerate(ordered, start=1)]
        parts = [tokenize(r) for r in rendered]
        if len(layout.head_tokens) + sum(map(len, parts)) + len(suffix) + reserve <= n_ctx or not chosen:
            break
        # Numbering can change a part's length by a token; drop the worst until it fits.
        chosen.remove(max(chosen, key=lambda p: (p.rank, p.source, p.first)))
    tokens, _ = _join(layout, [sum(parts, [])] if parts else [], suffix)
    prefix_len = len(tokens) - len(suffix)
    sources = [{"n": i, "source": p.source, "pages": list(p.pages), "chunks": [p.first, p.last],
                "excerpt": excerpt(p.text)} for i, p in enumerate(ordered, start=1)]
    # Passages differ from question to question: only the head (template and system prompt) is shared.
    boundaries = sorted({len(layout.head_tokens), prefix_len} - {0})
    return Prompt(prefix=layout.head + "".join(rendered), suffix=suffix_text + layout.tail, passages=ordered,
                  dropped=len(passages) - len(ordered), truncated=truncated, prefix_tokens=tokens[:prefix_len],
                  tokens=tokens, boundaries=boundaries, mode="passages", sources=sources)


def _with_text(p: Passage, text: str) -> Passage:
    return Passage(p.source, p.content_hash, p.first, p.last, p.pages, text, p.rank)
