"""When a prompt may be composed from section states: the mode, the quality budget, the calibration.

Composition is an approximation of exact prefill: a moved section did not attend to
the sections now before it. How much that costs depends on the model and on the
documents, so it is measured, per model file, KV settings and seams, on the user's own
collection (:mod:`.calibrate`): the mean KL divergence of the next-token distribution
(exact ‖ composed) and the top-1 agreement over teacher-forced answer tokens, the way
llama.cpp judges a quantization. The record (:class:`Calibration`) is kept with the
section states (:mod:`..cache.calibrations`).

``ask.compose`` (:class:`ComposeMode`):

* ``auto`` (the default): compose where the model can shift positions, its calibration
  is within ``ask.compose_max_kl`` and composing is predicted to start sooner (or about as
  soon: :data:`~.planner.MARGIN`); prefill exactly until it is calibrated;
* ``on``: compose every sections-mode prompt wherever the model can shift, calibrated or not;
* ``off``: never.

The default budget, 0.05 nats per token, sits between llama.cpp's own quantization
scoreboard entries for LLaMA 3 8B against FP16: q6_K 0.0055, q4_K_M 0.031, q4_1 0.072.
"""

from __future__ import annotations

import enum
import statistics
import time
from dataclasses import asdict, dataclass, field

from .seams import Seams


class ComposeMode(str, enum.Enum):
    """``ask.compose``, resolved once from the setting's text."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Refusal(str, enum.Enum):
    """Why a sections-mode prompt is prefilled exactly instead of composed (what ``reuse_lost`` names)."""

    OFF = "composition is off (ask.compose = \"off\")"
    NO_CACHE = "composition needs the prefix cache"
    CANNOT_SHIFT = ("this model's memory cannot be shifted (recurrent or hybrid layers): sections are reused "
                    "as a prefix only")
    NOT_CALIBRATED = "composition is not calibrated for this model yet: prefilled exactly"
    OVER_BUDGET = "composition is over the quality budget for this model (ask.compose_max_kl): prefilled exactly"
    EXACT_FASTER = "exact reuse of the memory or a saved prefix was predicted faster than composing"
    SERVER = "the generator is a server: it reuses prefixes only"


#: How calibrations are measured now. 2: the exact answer compared on is decoded as questions' answers
#: are, with ``ask.repeat_penalty``, over up to 64 positions (1: 32 positions without the penalty,
#: where small models' answers repeat one line and measure composition as closer to exact than it is).
#: A record of another method is measured again.
METHOD = 2


@dataclass(frozen=True)
class Calibration:
    """Composed against exact prefill for a model file, its KV settings and the seams, over several prompts.

    ``kls`` is each prompt's mean KL(exact ‖ composed) in nats per token, over its teacher-forced answer
    tokens; ``kl``, the figure the decision is taken on, is their mean (each prompt weighs the same, so
    one long answer does not decide alone), and ``spread`` their standard deviation. ``top1`` is the share
    of positions whose most likely token is the same, over ``tokens`` positions of ``prompts`` prompts of
    ``sections`` sections in all, measured by ``method`` (:data:`METHOD`).
    """

    model: str  # the model file's name (for people; the namespace keys it)
    namespace: str
    seams: str  # Seams.key
    kl: float
    top1: float
    tokens: int
    prompts: int = 1
    sections: int = 0
    measured_at: float = field(default_factory=time.time)
    method: int = METHOD
    kls: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.kls:  # one measurement (or a record from before per-prompt figures were kept)
            object.__setattr__(self, "kls", (self.kl,))

    @property
    def current(self) -> bool:
        """Whether it was measured the way calibrations are measured now."""
        return self.method == METHOD

    @property
    def complete(self) -> bool:
        """Whether it rests on enough: :data:`MIN_PROMPTS` prompts and :data:`MIN_TOKENS` positions."""
        return self.prompts >= MIN_PROMPTS and self.tokens >= MIN_TOKENS

    @property
    def spread(self) -> float:
        """The standard deviation of the prompts' figures (0 with one prompt)."""
        return statistics.stdev(self.kls) if len(self.kls) > 1 else 0.0

    def allowed(self, budget: float) -> bool:
        return self.kl <= budget

    def merged(self, other: Calibration) -> Calibration:
        """This record and ``other`` (same model and seams) as one: their prompts' figures together, the
        decision on their mean; ``other`` alone where the two were measured differently."""
        if self.tokens + other.tokens == 0 or self.method != other.method:
            return other
        n = self.tokens + other.tokens
        kls = self.kls + other.kls
        return Calibration(self.model, self.namespace, self.seams, kl=statistics.fmean(kls),
                           top1=(self.top1 * self.tokens + other.top1 * other.tokens) / n, tokens=n,
                           prompts=self.prompts + other.prompts, sections=self.sections + other.sections,
                           method=self.method, kls=kls)

    def to_dict(self, *, budget: float | None = None) -> dict:
        d = asdict(self)
        d["kl"], d["top1"] = round(self.kl, 5), round(self.top1, 4)
        d["kls"] = [round(k, 5) for k in self.kls]
        d["kl_spread"] = round(self.spread, 5)
        d["kl_range"] = [round(min(self.kls), 5), round(max(self.kls), 5)]
        if budget is not None:
            d["budget"] = budget
            d["allowed"] = self.allowed(budget)
        return d


#: Calibrations with fewer teacher-forced tokens than this, or fewer prompts than the next, are measured
#: further (after the next exact answer, or by the next warming).
MIN_TOKENS = 32
MIN_PROMPTS = 3


@dataclass(frozen=True)
class ComposePolicy:
    """``ask.compose``, ``ask.compose_seams`` / ``compose_recompute`` and ``ask.compose_max_kl``, typed."""

    mode: ComposeMode = ComposeMode.AUTO
    seams: Seams = field(default_factory=lambda: Seams("first", 32))
    max_kl: float = 0.05

    @property
    def enabled(self) -> bool:
        """Whether prompts may ever be composed (the engine then keeps the sequences composing needs)."""
        return self.mode is not ComposeMode.OFF

    def refusal(self, calibration: Calibration | None) -> Refusal | None:
        """Why the mode and the calibration do not let a prompt be composed now (None: they do); the
        planner adds what the model and the cache allow (:meth:`~.planner.Planner.refusal`)."""
        if self.mode is ComposeMode.OFF:
            return Refusal.OFF
        if self.mode is ComposeMode.ON:
            return None
        if calibration is None:
            return Refusal.NOT_CALIBRATED
        return None if calibration.allowed(self.max_kl) else Refusal.OVER_BUDGET

    def wants_calibration(self, calibration: Calibration | None) -> bool:
        """Whether a measurement should still be taken: in ``auto``, until a complete one exists."""
        return self.mode is ComposeMode.AUTO and (calibration is None or not calibration.complete)


__all__ = ["Calibration", "ComposeMode", "ComposePolicy", "METHOD", "MIN_PROMPTS", "MIN_TOKENS", "Refusal"]
