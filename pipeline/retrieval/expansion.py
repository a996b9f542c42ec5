"""HyDE, off by default (``retrieval.hyde``): the generator writes a short passage that would answer
the question, and the dense side embeds the question together with it, so the query vector sits
among passages rather than questions. The lexical side still searches the question alone. One
short generation per query; a small default generator writes poor passages, which is why it is
off (see docs/retrieval.md for what it measured). Its ingest-time counterpart, doc2query, is
:mod:`pipeline.ingest.doc2query`.
"""

from __future__ import annotations

from typing import Any

from ..engine.oneshot import generate_text

HYDE_SYSTEM = ("You write documentation. Answer with one short paragraph, as the product's manual would "
               "word it. Do not mention the question.")


def hypothetical_passage(engine: Any, question: str, *, max_tokens: int) -> str:
    """A short passage that would answer ``question`` (HyDE)."""
    return generate_text(engine, HYDE_SYSTEM, question, max_tokens=max_tokens)


def hyde_query(question: str, passage: str) -> str:
    """What the dense side embeds with HyDE: the question, then the hypothetical passage."""
    return f"{question}\n\n{passage}" if passage else question
