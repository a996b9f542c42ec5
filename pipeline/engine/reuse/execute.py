"""Carrying a :class:`~.plan.ReusePlan` out, as planned: the one place a plan becomes work on the memory.

Nothing here decides: the planner has (:mod:`.planner`). A composed plan restores, computes and
recomputes what it names (:meth:`.sections.SectionReuse.run`); an exact plan keeps or restores
its prefix (:meth:`.prefix.PrefixReuse.prepare`) and prefills up to the prompt's last cut,
saving states at its save points (:meth:`.prefix.PrefixReuse.advance`). A step that fails
(a state that fails its checks, a cut the memory refuses) falls back to the way that needs
nothing saved, and says so in the prompt's notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from .plan import ReusePlan

if TYPE_CHECKING:
    from ..contract import EngineStats
    from .memory import Memory
    from .planner import Planner


def carry_out(planner: Planner, plan: ReusePlan, model, memory: Memory, stats: EngineStats,
              prefill: Callable[[Sequence[int], int], None], *, begin: Callable[[int | None], None]) -> int:
    """Bring ``memory`` (on ``model``) to ``plan``: the prompt's documents part composed, or its prefix up to
    the last cut reused and prefilled. ``begin(reused)`` is called when the prompt's own computing starts
    (``reused`` None for a composition: known once it is done); ``prefill(tokens, start)`` decodes. Fills
    what was reused into ``stats`` and returns how many tokens were (seams aside)."""
    report(planner, plan, stats)
    shape = plan.shape
    if plan.composed is not None:
        begin(None)  # composing's decodes (new sections, seams) are the prompt's prefill
        done = planner.sections.run(plan.composed, shape, model, memory, stats, prefill)
        planner.speeds.saw(seam_tokens=done.recomputed_tokens, seam_seconds=done.seconds["recompute"],
                           section_tokens=done.restored_tokens, section_seconds=done.seconds["restore"])
        return stats.cached_tokens - stats.recomputed_tokens
    done = planner.prefix.prepare(plan.exact, shape, memory, stats)
    stats.notes.extend(done.notes)
    if done.restore is not None:
        entry = done.restore.entry
        planner.speeds.saw(restored=entry.bytes, restore_seconds=stats.cache_load_seconds,
                           bytes_per_token=entry.bytes / max(1, entry.n_tokens))
    begin(done.reused)
    planner.prefix.advance(done, shape, memory, stats, prefill)
    return done.reused


def report(planner: Planner, plan: ReusePlan, stats: EngineStats) -> None:
    """What the plan says for people: the way chosen and its predicted seconds, and why a sections-mode
    prompt was not composed (each section computed for want of it)."""
    stats.plan = plan.way
    stats.predicted_seconds = plan.predicted_seconds
    stats.predicted_exact_seconds = plan.seconds.get("exact", 0.0)
    lost = plan.lost_sections if planner.policy.enabled else 0
    if lost:
        stats.sections_lost = [plan.refusal.value] * lost
        stats.notes.append(plan.refusal.value)


__all__ = ["carry_out", "report"]
