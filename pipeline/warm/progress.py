"""How far warming is: one count of tokens over its stages, with its rate and the time left.

Warming's work is tokens computed: a calibration prefills its prompts exactly, composes them
(computing the sections that have no state) and decodes a short answer; saving section states
prefills each section on its own. Counting all of it in one unit from the first second gives a
rate and a time left that hold across the stages (``rate`` is the average since the start, so a
pause for a question stretches it, and the time left grows honestly).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

#: A decoded answer token costs about this many prefill tokens of time (one decode per token, where
#: prefill takes them by the batch; a 270M model on 2 CPU cores prefills about 430 tokens/s and decodes
#: about 25): how the calibration's answers count toward the total.
DECODE_WEIGHT = 16


@dataclass
class WarmProgress:
    """One look at warming: ``stage`` (what it does now, for people), ``done`` of ``total`` tokens, since
    ``started`` (``time.monotonic()``)."""

    stage: str = "starting"
    done: int = 0
    total: int = 0
    started: float = field(default_factory=time.monotonic)
    unit: str = "tokens"

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        """Tokens per second so far (0 until some are done)."""
        return self.done / self.seconds if self.done and self.seconds > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far (None until there is a rate)."""
        rate = self.rate
        return max(0.0, (self.total - self.done) / rate) if rate else None

    def to_dict(self) -> dict:
        eta = self.eta
        return {"stage": self.stage, "done": self.done, "total": self.total, "unit": self.unit,
                "seconds": round(self.seconds, 1), "tokens_per_second": round(self.rate, 1),
                "eta_seconds": None if eta is None else round(eta, 1)}


class Meter:
    """Counts warming's tokens and tells ``callback`` (a :class:`WarmProgress` each time; None: nobody)."""

    def __init__(self, callback: Callable[[WarmProgress], None] | None = None):
        self.progress = WarmProgress()
        self._callback = callback

    def stage(self, text: str, *, total: int | None = None) -> None:
        """A new stage (``total``: the whole work's tokens, where now known better)."""
        self.progress.stage = text
        if total is not None:
            self.progress.total = max(total, self.progress.done)
        self._tell()

    def add(self, tokens: int) -> None:
        if tokens > 0:
            self.progress.done += tokens
            self.progress.total = max(self.progress.total, self.progress.done)
            self._tell()

    def _tell(self) -> None:
        if self._callback is not None:
            self._callback(self.progress)


__all__ = ["DECODE_WEIGHT", "Meter", "WarmProgress"]
