"""When a prompt may be composed from section states: the mode, the quality budget, the calibration.

Composition is an approximation of exact prefill: a moved section did not attend to
the sections now before it. How much that costs depends on the model and on the
documents, so it is measured, per model file, KV settings and seams, on the user's own
collection (:mod:`.calibrate`): the mean KL divergence of the next-token distribution
(exact ‖ composed) and the top-1 agreement over teacher-forced answer tokens, the way
llama.cpp judges a quantization. The record (:class:`~..cache.calibrations.Calibration`) is kept with
the section states (:mod:`..cache.calibrations`), below the reuse that reads it.

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
from dataclasses import dataclass, field

from ..cache.calibrations import Calibration
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


__all__ = ["ComposeMode", "ComposePolicy", "Refusal"]
