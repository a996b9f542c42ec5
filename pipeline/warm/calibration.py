"""Composition's calibration: measured before any question on prompts of the collection's own sections, and its status.

Whether prompts are composed is decided by how far composition moves a model's answers from
exact prefill's (:mod:`pipeline.engine.reuse.budget`). One prompt's figure depends on that
prompt and on its answer, and a small model's answer on the CPU's arithmetic, so a decision
on one prompt can go one way on one machine and the other way on the next. A calibration
therefore measures several prompts over different parts of the collection (:data:`PROMPTS`),
and the decision is taken on their mean, with their spread kept beside it.

Its cost is kept to about one question's prefill beyond the section states it saves (which
warming and later questions need anyway): the prompts are the shortest a composition can be
measured on, two sections and the question, each section's state computed once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.cache.calibrations import MIN_PROMPTS
from ..errors import redact
from ..engine.reuse.calibrate import TOKENS
from ..records import Prompt
from ..ask.packing import Shelf, number, shelf_prompt
from ..ask.prompt import Layout, SectionTokens, Tokenize
from .progress import DECODE_WEIGHT, Meter

if TYPE_CHECKING:
    from ..engine.context_lock import CancelToken
    from ..runtime import Runtime

#: What a calibration prompt asks: any question works (it compares distributions), one that makes the
#: model read the documents is closest to a real one.
CALIBRATION_QUESTION = "Summarize what the documents above say, citing them."

#: Prompts a calibration measures at least (each of two sections, from different parts of the collection).
PROMPTS = MIN_PROMPTS


def calibration_prompts(shelf: Shelf, *, layout: Layout, tokenize: Tokenize, memo: SectionTokens, n_ctx: int,
                        reserve: int, count: int = PROMPTS) -> list[Prompt]:
    """``count`` sections-mode prompts of the collection's own sections to calibrate composition on, each
    of two sections that lie apart (the first from the ``i``-th part of the collection, the second from
    the middle of the next part), so that together they cover the whole collection; fewer where the
    collection has fewer sections, none where two sections do not fit the context."""
    suffix = f"Question: {CALIBRATION_QUESTION}"
    budget = layout.budget(n_ctx=n_ctx, reserve=reserve, suffix_tokens=len(layout.suffix(suffix, tokenize)))
    sections = [s for s in shelf.sections if s.key in shelf.segments]
    n = len(sections)
    pairs: list[tuple[int, int]] = []
    for i in range(count):
        a = (i * n) // count
        b = min(n - 1, a + max(1, n // (2 * count)))
        if a < b and (a, b) not in pairs:
            pairs.append((a, b))
    prompts = []
    for a, b in pairs:
        packed = number(shelf, [sections[a], sections[b]], memo)
        if sum(len(p.tokens) for p in packed) <= budget:
            prompts.append(shelf_prompt(shelf, packed, suffix, layout=layout, tokenize=tokenize, mode="sections",
                                        top_k=0))
    return prompts


def wanted_prompts(rt: "Runtime", shelf: Shelf) -> list[Prompt]:
    """The prompts of ``shelf`` a calibration would measure now: as many as the model's record still wants
    (none where it is complete, or ``ask.compose`` is not ``auto``; once per model and settings)."""
    engine = rt.engine
    record = engine.calibration
    if not rt.compose_policy.wants_calibration(record):
        return []
    wanted = PROMPTS - (record.prompts if record is not None else 0)
    return calibration_prompts(shelf, layout=rt.layout(), tokenize=engine.tokenize, memo=rt.section_memo,
                               n_ctx=engine.n_ctx, reserve=rt.reserve(), count=max(1, wanted))


def sections_of(prompts: list[Prompt]) -> set[tuple[int, ...]]:
    """The tokens of every section ``prompts`` hold: the states calibrating on them computes and saves."""
    held = set()
    for prompt in prompts:
        shape = prompt.shape
        if shape.sections is not None:
            bounds = (shape.sections.head, *shape.sections.ends)
            held.update(shape.tokens[a:b] for a, b in zip(bounds, bounds[1:]))
    return held


def cost(prompts: list[Prompt]) -> int:
    """The tokens calibrating on ``prompts`` counts in its progress: each prefilled exactly and composed (its
    question and answer teacher-forced), and its answer decoded token by token."""
    return sum(2 * len(p.tokens) + TOKENS * (DECODE_WEIGHT + 1) for p in prompts)


def calibrate(rt: "Runtime", prompts: list[Prompt], *, meter: Meter | None = None,
              cancel: "CancelToken | None" = None) -> None:
    """Calibrate composition on ``prompts`` (:func:`wanted_prompts`), one after the other, each merged into
    the model's record; stops early where an answer meanwhile completed it. ``meter`` counts the tokens."""
    engine, meter = rt.engine, meter or Meter()
    for i, prompt in enumerate(prompts, 1):
        if not rt.compose_policy.wants_calibration(engine.calibration):
            return
        meter.stage(f"calibrating composition (prompt {i} of {len(prompts)})")
        engine.calibrate(prompt.shape, repeat_penalty=rt.config.ask.repeat_penalty, cancel=cancel,
                         progress=meter.add)
        meter.add(TOKENS * DECODE_WEIGHT)  # its exact answer, decoded token by token


def calibration_dict(rt: "Runtime") -> dict | None:
    """The calibration now in force, as reports show it (None: not measured)."""
    record = rt.engine.calibration
    return record.to_dict(budget=rt.compose_policy.max_kl) if record is not None else None


def status(rt: "Runtime") -> dict:
    """:meth:`Pipeline.calibration <pipeline.api.Pipeline.calibration>`: the configured generator's
    composition calibration and what the reuse planner decides by it (``allowed``, and ``reason`` where
    not), read without loading or fetching a model and without creating anything."""
    from ..engine.reuse.budget import Refusal

    policy = rt.compose_policy
    out = {"mode": policy.mode.value, "model": redact(rt.config.models.generator), "seams": policy.seams.key,
           "kl": None, "top1": None, "tokens": 0, "prompts": 0, "budget": policy.max_kl, "allowed": False}
    engine, refusal = rt.composition()
    if engine is None:
        return {**out, "reason": "the generator is not provisioned yet (`rag models pull`, or the first `rag ask`)"}
    if refusal is not Refusal.SERVER:
        out["model"] = engine.model_path.name
    record = engine.calibration if refusal is not Refusal.SERVER else None
    if record is not None:
        out.update(record.to_dict(budget=policy.max_kl))
        out["model"] = record.model
    out["allowed"] = refusal is None
    if refusal is not None:
        out["reason"] = refusal.value
    return out


__all__ = ["CALIBRATION_QUESTION", "PROMPTS", "calibrate", "calibration_dict", "calibration_prompts", "cost",
           "sections_of", "status", "wanted_prompts"]
