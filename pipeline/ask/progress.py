"""Progress of a prefill while the user waits: tokens done, speed, time left.

The engine reports tokens after each ``n_batch`` piece it decodes; this turns that into
what a person or a progress bar wants. The CLI draws it (``rag ask`` on a terminal,
for prompts that take more than a second); apps pass ``progress=`` to ``ask``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PrefillProgress:
    """One step of a prefill: ``done`` of ``total`` tokens (those not reused from a cache)."""

    done: int
    total: int
    seconds: float
    tokens_per_second: float
    eta_seconds: float | None

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def describe(self) -> str:
        eta = f", ETA {self.eta_seconds:.0f} s" if self.eta_seconds is not None and not self.finished else ""
        return (f"prefill {self.done:,}/{self.total:,} tokens ({self.done / max(self.total, 1):.0%}), "
                f"{self.tokens_per_second:,.0f} tok/s{eta}")


def tracker(callback: Callable[[PrefillProgress], None]) -> Callable[[int, int], None]:
    """An engine progress hook (``done, total``) that calls ``callback`` with rates and ETA."""
    started: list[float] = []

    def hook(done: int, total: int) -> None:
        now = time.perf_counter()
        if not started:
            started.append(now)
        elapsed = now - started[0]
        rate = done / elapsed if elapsed > 0 and done else 0.0
        eta = (total - done) / rate if rate else None
        callback(PrefillProgress(done, total, elapsed, rate, eta))

    return hook
