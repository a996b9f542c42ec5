"""One short greedy answer from a generator, for the helpers that write text rather than answers
(HyDE's hypothetical passage at query time, doc2query's questions at ingest)."""

from __future__ import annotations

from typing import Any


def generate_text(engine: Any, system: str, user: str, *, max_tokens: int) -> str:
    """One greedy answer of ``engine`` (a :class:`~pipeline.engine.contract.TextGenerator`)."""
    tokens = engine.tokenize(engine.chat(system, user), special=True)
    return engine.generate(tokens, max_tokens=max_tokens, temperature=0.0).read().strip()
