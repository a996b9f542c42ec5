"""The reuse planner: for one prompt and what an engine holds, the one :class:`~.plan.ReusePlan`.

The engine asks once per prompt, with the prompt's shape (:class:`~pipeline.records.PromptShape`)
and its memory; the pool routes by the same plan (:meth:`Planner.held`) and the packer
weighs candidate prompts by it (:meth:`Planner.plan` ``.reused``, a probe).

How it chooses:

1. **Exact** reuse is always planned (:mod:`.prefix`): the memory's common prefix up to
   a cut, or the longest state saved at a cut (host memory first, then disk).
2. A **sections-mode** prompt may instead be **composed** from section states
   (:mod:`.sections`), where the model's memory can shift positions and ``ask.compose``
   allows it: ``on``; or ``auto`` and the model's calibration on this collection is
   within the quality budget (:mod:`.budget`). Otherwise :class:`~.budget.Refusal` says why.
3. Between the two (in ``auto``; ``on`` always composes), the **predicted time to the first token**
   decides. Exact: tokens to prefill at the measured prefill speed plus bytes to restore at the
   measured restore speed. Composed: the sections without a state at the prefill speed, the section
   states at the speed they were placed at, and the seams and the question at the speed of the few
   tokens decoded deep in a composition. The speeds are kept with the calibrations (:class:`Speeds`),
   so a new process predicts from what the ones before it measured. Composition wins ties within
   :data:`MARGIN`; one that computes sections with no state yet (and saves them) also wins where what
   it costs more than exact now, one later question over the same sections gains back.

What the model's memory allows is its kind (:mod:`.kinds`), a strategy chosen once: a memory
that can be cut anywhere keeps its common prefix in place; one that cannot (recurrent and
hybrid models) reuses only states saved exactly at cuts, checkpoints at every boundary in
host memory, and never composes.

The plan binds: the engine carries it out as planned (:meth:`~..local.Engine.generate`), and
every other user asks the same planner with what its prompt needs (:class:`~.plan.Need`):
warming a prefix and decoding several prompts together need ``EXACT``; a calibration's
measurement needs ``COMPOSED``; the pool routes by :meth:`Planner.held`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Mapping

from ..cache.calibrations import Calibration
from .budget import ComposeMode, ComposePolicy, Refusal
from .memory import Memory
from .plan import Need, PrefixPlan, ReusePlan, SectionsPlan
from .prefix import PrefixReuse
from .sections import SectionReuse
from ...records import PromptShape

if TYPE_CHECKING:
    from ..cache.calibrations import Calibrations
    from ..cache.protocol import StateStore
    from ..cache.prefix_cache import PrefixCache

MARGIN = 0.10
"""Composition is chosen while its predicted time to the first token is within this share of exact's."""


class Speeds:
    """What the predictions run on, measured on this engine's prompts (an exponential average of each; a
    guess, :data:`GUESSES`, until its first measurement) and kept with the calibrations, so that a new
    process predicts from what the processes before it measured:

    - ``prefill``: tokens per second of a prompt prefilled in batches;
    - ``seams``: tokens per second of the small decodes deep in a composed prompt (its seams, and the
      question after its sections);
    - ``restore``: bytes per second of a saved prefix state brought back, ``bytes_per_token`` its size;
    - ``section_restore``: tokens per second of section states placed into a composition.
    """

    GUESSES = {"prefill": 500.0, "seams": 0.0, "restore": 1e9, "section_restore": 50_000.0,  # seams: SEAMS_SHARE
               "bytes_per_token": 0.0}
    #: Until the seams are measured: their speed as a share of the prefill speed (measured or guessed);
    #: Gemma 3 270M on two cores decodes seams at about 150 tokens/s and prefills at about 430.
    SEAMS_SHARE = 0.35

    def __init__(self, measured: Mapping[str, float] | None = None):
        self.measured = {k: float(v) for k, v in (measured or {}).items()
                         if k in self.GUESSES and isinstance(v, (int, float)) and math.isfinite(v) and v > 0}
        self.changed = False  # measured since it was read or last kept

    def _get(self, name: str) -> float:
        if name == "seams" and name not in self.measured:
            return self.SEAMS_SHARE * self.prefill
        return self.measured.get(name, self.GUESSES[name])

    prefill = property(lambda self: self._get("prefill"))
    seams = property(lambda self: self._get("seams"))
    restore = property(lambda self: self._get("restore"))
    section_restore = property(lambda self: self._get("section_restore"))
    bytes_per_token = property(lambda self: self._get("bytes_per_token"))

    def _average(self, name: str, value: float) -> None:
        old = self.measured.get(name)
        self.measured[name] = value if old is None else 0.7 * old + 0.3 * value
        self.changed = True

    def saw(self, *, tokens: int = 0, seconds: float = 0.0, restored: int = 0, restore_seconds: float = 0.0,
            bytes_per_token: float = 0.0, seam_tokens: int = 0, seam_seconds: float = 0.0,
            section_tokens: int = 0, section_seconds: float = 0.0) -> None:
        """One prompt's figures: ``tokens`` prefilled in batches in ``seconds``, a prefix state of
        ``restored`` bytes brought back in ``restore_seconds``, ``seam_tokens`` decoded at a composition's
        seams in ``seam_seconds``, section states of ``section_tokens`` placed in ``section_seconds``."""
        if tokens >= 64 and seconds > 0:
            self._average("prefill", tokens / seconds)
        if seam_tokens >= 16 and seam_seconds > 0:
            self._average("seams", seam_tokens / seam_seconds)
        if restored >= 2**20 and restore_seconds > 0:
            self._average("restore", restored / restore_seconds)
        if section_tokens >= 256 and section_seconds > 0:
            self._average("section_restore", section_tokens / section_seconds)
        if bytes_per_token > 0:
            self.measured["bytes_per_token"] = bytes_per_token
            self.changed = True

    def seconds(self, *, prefill: int, restore_bytes: float = 0.0, seams: int = 0, sections: int = 0) -> float:
        """The predicted seconds of ``prefill`` tokens in batches, ``restore_bytes`` of prefix state, ``seams``
        tokens decoded deep in a composition and ``sections`` tokens of section states placed."""
        return (prefill / self.prefill + restore_bytes / self.restore + seams / self.seams
                + sections / self.section_restore)


class Planner:
    """The reuse planner of one engine: prefix reuse over ``store`` (disk) and ``ram`` (host memory),
    section states in ``store``, the ``policy`` (``ask.compose``, seams, budget) and the calibrations
    that judge it. ``namespace()`` names the model and KV settings; ``model_name()`` the model file."""

    def __init__(self, store: PrefixCache | None, *, namespace: Callable[[], str], policy: ComposePolicy,
                 min_tokens: int = 256, boundary_states: int = 4, ram: StateStore | None = None,
                 calibrations: Calibrations | None = None, model_name: Callable[[], str] = lambda: ""):
        self.policy = policy
        self.prefix = PrefixReuse(store, namespace=namespace, min_tokens=min_tokens,
                                  boundary_states=boundary_states, ram=ram)
        self.sections = SectionReuse(store, namespace=namespace, seams=policy.seams)
        self.calibrations = calibrations
        self._speeds: Speeds | None = None  # read from the calibrations when first needed
        self._namespace = namespace
        self._model_name = model_name
        self._calibration: tuple[Calibration | None] | None = None  # read once; None: not read yet

    # -- what the predictions run on ---------------------------------------------------------------

    @property
    def speeds(self) -> Speeds:
        """The speeds this model and its settings were measured at (kept by :meth:`keep_speeds`)."""
        if self._speeds is None:
            kept = self.calibrations.speeds(self._namespace()) if self.calibrations is not None else None
            self._speeds = Speeds(kept)
        return self._speeds

    def keep_speeds(self) -> None:
        """Keep what was measured since the speeds were read, for the next process (after an answer: never
        on the way to its first token)."""
        speeds = self._speeds
        if speeds is not None and speeds.changed and self.calibrations is not None:
            speeds.changed = False
            self.calibrations.keep_speeds(self._namespace(), speeds.measured)

    # -- what is allowed -------------------------------------------------------------------------

    def calibration(self) -> Calibration | None:
        """This model's calibration for the configured seams (read once, then kept)."""
        if self._calibration is None:
            found = None
            if self.calibrations is not None:
                found = self.calibrations.get(self._namespace(), self.policy.seams.key)
            self._calibration = (found,)
        return self._calibration[0]

    def calibrated(self, record: Calibration) -> Calibration:
        """Keep a new measurement (merged with the earlier one); the record now in force."""
        if self.calibrations is not None:
            record = self.calibrations.add(record)
        else:
            old = self.calibration()
            record = old.merged(record) if old is not None else record
        self._calibration = (record,)
        return record

    def new_calibration(self, **figures) -> Calibration:
        """A record of this model and seams with ``figures`` (``kl``, ``top1``, ``tokens``, ``prompts``...)."""
        return Calibration(self._model_name(), self._namespace(), self.policy.seams.key, **figures)

    def refusal(self, memory: Memory, *, calibrated: bool = True) -> Refusal | None:
        """Why a sections-mode prompt may not be composed on this engine now (None: it may): the one
        answer to "may this compose" (the engine, warming, the status and the section size all ask it).
        ``calibrated=False`` leaves the calibration out: whether prompts could ever be composed here."""
        if not self.policy.enabled:
            return Refusal.OFF
        if not memory.kind.composes:
            return Refusal.CANNOT_SHIFT
        if not self.sections.available:
            return Refusal.NO_CACHE
        return self.policy.refusal(self.calibration()) if calibrated else None

    def require_sections(self, memory: Memory) -> None:
        """Refuse (:class:`~pipeline.errors.EngineError`) to save section states that no prompt would
        ever compose from: composition off, no cache, a model that cannot shift. (A model not yet
        calibrated, or over its budget, may still be: ``ask.compose = "on"``, another budget.)"""
        from ...errors import EngineError

        refusal = self.refusal(memory, calibrated=False)
        if refusal is not None:
            raise EngineError(f"section states cannot be used: {refusal.value}")

    def wants_calibration(self, shape: PromptShape, memory: Memory) -> bool:
        """Whether this prompt's exact answer should be measured against its composition: ``auto``,
        no calibration of enough tokens yet, a prompt of two sections or more, a model that shifts."""
        s = shape.sections
        return (s is not None and len(s.ends) >= 2 and self.refusal(memory, calibrated=False) is None
                and self.policy.wants_calibration(self.calibration()))

    # -- planning ----------------------------------------------------------------------------

    def plan(self, shape: PromptShape, memory: Memory, *, need: Need = Need.ANSWER, probe: bool = False) -> ReusePlan:
        """The one plan for ``shape`` on ``memory``, which the engine carries out as it is. ``need``: what
        the prompt requires (:class:`~.plan.Need`); ``probe``: a look that is not a use (no miss counted)."""
        exact = self.prefix.plan(shape, memory, probe=probe)
        seconds = {"exact": self._exact_seconds(shape, exact)}
        calibrate = need is not Need.COMPOSED and self.wants_calibration(shape, memory)
        if shape.sections is None or need is Need.EXACT:
            return ReusePlan(shape, exact, seconds=seconds, calibrate=calibrate)
        refusal = self.refusal(memory, calibrated=need is Need.ANSWER)
        if refusal is not None:
            return ReusePlan(shape, exact, refusal=refusal, seconds=seconds, calibrate=calibrate)
        composed = self.sections.plan(shape, memory)
        seconds["composed"] = self._composed_seconds(shape, composed)
        if (need is Need.COMPOSED or self.policy.mode is ComposeMode.ON
                or self._composing_pays(shape, composed, seconds)):
            return ReusePlan(shape, exact, composed, seconds=seconds)
        return ReusePlan(shape, exact, refusal=Refusal.EXACT_FASTER, seconds=seconds, calibrate=calibrate)

    def _composing_pays(self, shape: PromptShape, composed: SectionsPlan, seconds: dict[str, float]) -> bool:
        """Composing is predicted to start within :data:`MARGIN` of exact; or it computes sections that have no
        state yet (and saves them) and what that costs more than exact now, one later question over the same
        sections gains back by composing them from their states instead of prefilling them exactly."""
        if seconds["composed"] <= seconds["exact"] * (1 + MARGIN):
            return True
        if not composed.missing_tokens:
            return False
        warm = self._composed_seconds(shape, replace(composed, saved=(True,) * len(composed.saved)))
        return seconds["composed"] - seconds["exact"] <= seconds["exact"] - warm

    def _exact_seconds(self, shape: PromptShape, exact: PrefixPlan) -> float:
        restore = exact.restore.entry.bytes if exact.restore is not None else 0
        return self.speeds.seconds(prefill=len(shape) - exact.reused, restore_bytes=restore)

    def _composed_seconds(self, shape: PromptShape, composed: SectionsPlan) -> float:
        s = shape.sections
        assert s is not None
        prefill, restore = composed.missing_tokens, 0
        if not composed.held_tokens:
            if composed.head is not None:
                restore = composed.head.entry.bytes
            else:
                prefill += s.head
        # The question after the sections is decoded as the seams are: a few tokens deep in the context.
        return self.speeds.seconds(prefill=prefill, restore_bytes=restore, sections=composed.restorable_tokens,
                                   seams=len(composed.seams) + len(shape) - s.end)

    def held(self, shape: PromptShape, memory: Memory) -> int:
        """How much of ``shape`` the memory itself holds as the plan would use it (what a pool routes by):
        a composition's leading sections for a composed prompt, else the exact common prefix."""
        if shape.sections is not None and memory.composed and self.refusal(memory) is None:
            return self.sections.held(shape, memory)
        return self.prefix.held(shape, memory)


__all__ = ["MARGIN", "Planner", "Speeds"]
