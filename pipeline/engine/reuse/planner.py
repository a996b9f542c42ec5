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
3. Between the two (in ``auto``; ``on`` always composes), the **predicted time to the first token** decides: tokens to
   prefill at the measured prefill speed (composed: the sections without a state, the
   seams and the question) plus bytes to restore at the measured restore speed.
   Composition wins ties within :data:`MARGIN`: the section states it saves make every
   later question faster, and a cold composed prompt costs about what exact prefill does
   (sections are computed on their own, with shorter attention, plus a few seams).

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

from typing import TYPE_CHECKING, Callable

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
    """What the predictions run on: prefill tokens per second and restore bytes per second, measured on
    this engine's prompts (an exponential average; a guess until the first measurement)."""

    def __init__(self, *, prefill: float = 500.0, restore: float = 1e9, bytes_per_token: float = 0.0):
        self.prefill, self.restore, self.bytes_per_token = prefill, restore, bytes_per_token

    def saw(self, *, tokens: int = 0, seconds: float = 0.0, restored: int = 0, restore_seconds: float = 0.0,
            bytes_per_token: float = 0.0) -> None:
        if tokens >= 64 and seconds > 0:
            self.prefill = 0.7 * self.prefill + 0.3 * (tokens / seconds)
        if restored >= 2**20 and restore_seconds > 0:
            self.restore = 0.7 * self.restore + 0.3 * (restored / restore_seconds)
        if bytes_per_token > 0:
            self.bytes_per_token = bytes_per_token

    def seconds(self, *, prefill: int, restore_bytes: float) -> float:
        return prefill / self.prefill + restore_bytes / self.restore


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
        self.speeds = Speeds()
        self._namespace = namespace
        self._model_name = model_name
        self._calibration: tuple[Calibration | None] | None = None  # read once; None: not read yet

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
                or seconds["composed"] <= seconds["exact"] * (1 + MARGIN)):
            return ReusePlan(shape, exact, composed, seconds=seconds)
        return ReusePlan(shape, exact, refusal=Refusal.EXACT_FASTER, seconds=seconds, calibrate=calibrate)

    def _exact_seconds(self, shape: PromptShape, exact: PrefixPlan) -> float:
        restore = exact.restore.entry.bytes if exact.restore is not None else 0
        return self.speeds.seconds(prefill=len(shape) - exact.reused, restore_bytes=restore)

    def _composed_seconds(self, shape: PromptShape, composed: SectionsPlan) -> float:
        s = shape.sections
        assert s is not None
        prefill = len(shape) - s.end + composed.missing_tokens + len(composed.seams)
        restore = composed.restorable_tokens * self.speeds.bytes_per_token
        if not composed.held_tokens:
            if composed.head is not None:
                restore += composed.head.entry.bytes
            else:
                prefill += s.head
        return self.speeds.seconds(prefill=prefill, restore_bytes=restore)

    def held(self, shape: PromptShape, memory: Memory) -> int:
        """How much of ``shape`` the memory itself holds as the plan would use it (what a pool routes by):
        a composition's leading sections for a composed prompt, else the exact common prefix."""
        if shape.sections is not None and memory.composed and self.refusal(memory) is None:
            return self.sections.held(shape, memory)
        return self.prefix.held(shape, memory)


__all__ = ["MARGIN", "Planner", "Speeds"]
