"""Calibrating composition on the user's own documents: composed against exact, on teacher-forced tokens.

A calibration takes a sections-mode prompt of the collection and the next-token logits
exact prefill gave at each answer position (recorded while the answer was decoded, see
:class:`Recorder`), composes the same prompt from section states (computing and saving
the sections that have none: what later questions restore), decodes the question and
the same answer tokens (teacher forcing), and compares the two distributions position by
position: the mean KL(exact ‖ composed) in nats, and the share of positions whose most
likely token agrees. That is how llama.cpp's perplexity tool judges a quantization
against the full-precision model (``--kl-divergence``), applied to composition.

Its cost is what the first composed question would pay anyway (the sections' own
states) plus a decode of the question and the answer: it runs after an answer has
finished streaming, or at the end of ``rag warm --sections``, never before a first token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...records import PromptShape

if TYPE_CHECKING:
    import numpy as np

    from ..contract import EngineStats
    from .memory import Memory
    from .planner import Planner

#: Answer positions compared per prompt, at most (an answer that ends sooner gives fewer: a record
#: under :data:`~..cache.calibrations.MIN_TOKENS` is measured again after a later answer). One prompt's figure
#: varies with its answer, and a small model's answer with the CPU's arithmetic: 32 positions moved
#: it by more than half the default budget.
TOKENS = 64


@dataclass
class Recorder:
    """The exact logits of an answer's first :data:`TOKENS` positions, and the tokens decoded there."""

    shape: PromptShape
    logits: list[Any] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.logits) >= TOKENS

    def saw(self, logits: Any, token: int) -> None:
        if not self.full:
            self.logits.append(logits)
            self.tokens.append(token)


@dataclass(frozen=True)
class Measured:
    kl: float
    top1: float
    tokens: int


def compare(exact: Sequence[Any], composed: Any) -> Measured:
    """Mean KL(exact ‖ composed) and top-1 agreement over positions: ``exact`` one logits row per
    position, ``composed`` an array of the same rows."""
    import numpy as np

    e = np.asarray(np.stack(exact), dtype=np.float64)
    c = np.asarray(composed, dtype=np.float64)
    le, lc = _log_softmax(e), _log_softmax(c)
    kl = np.sum(np.exp(le) * (le - lc), axis=1)
    top1 = e.argmax(axis=1) == c.argmax(axis=1)
    return Measured(float(np.mean(np.maximum(kl, 0.0))), float(np.mean(top1)), len(e))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    import numpy as np

    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=1, keepdims=True))


def measure(model, memory: Memory, record: Recorder, planner: Planner, stats: EngineStats,
            prefill: Callable[[Sequence[int], int], None], *,
            progress: Callable[[int], None] | None = None) -> Measured:
    """Compose ``record``'s prompt on ``model`` as the planner plans it composed (section states restored,
    or computed and saved), decode its question and answer tokens with the logits of every position,
    and compare with the exact logits recorded. Leaves ``memory`` holding the composed prompt and the
    answer tokens. ``progress(tokens)`` is told of the tokens computed as it goes."""
    import numpy as np

    from ...errors import EngineError
    from .._llama import composing
    from .plan import Need

    shape, n = record.shape, len(record.logits)
    plan = planner.plan(shape, memory, need=Need.COMPOSED)
    if plan.composed is None:
        raise EngineError(f"composition cannot be measured here: {plan.refusal.value if plan.refusal else 'no plan'}")
    planner.sections.run(plan.composed, shape, model, memory, stats, prefill, progress=progress)
    end = shape.sections.end
    tail = list(shape.tokens[end:]) + record.tokens[:n - 1]
    first = len(shape) - 1 - end  # the offset in ``tail`` of the last prompt token: answer position 0
    rows, step = [], model.n_batch
    for lo in range(0, len(tail), step):
        chunk = tail[lo:lo + step]
        composing.decode_outputs(model, np.asarray(chunk, dtype=np.int32), end + lo, every=True)
        got = composing.output_logits(model, len(chunk))
        rows.extend(got[max(0, first - lo):])
    memory.tokens.extend(tail)
    if progress is not None:
        progress(len(tail))
    return compare(record.logits, np.stack(rows[:n]))


def run_pending(engine, *, cancel=None, progress: Callable[[int], None] | None = None):
    """Measure composition on ``engine`` (a :class:`~..local.Engine`) against the exact answer an earlier
    prompt recorded (``engine.pending_calibration``): that prompt composed from section states (the
    sections without one computed and saved), compared on the answer's tokens; the calibration kept
    (:meth:`~.planner.Planner.calibrated`), or None where nothing is pending. The turn gives way to any
    prompt that queues meanwhile (the measurement then stays pending for later)."""
    from ...errors import Cancelled, EngineClosed, EngineError
    from ..contract import EngineStats

    record, engine.pending_calibration = engine.pending_calibration, None
    if record is None:
        return None
    planner, memory = engine.planner, engine.memory
    try:
        with engine.turn(cancel, preemptible=True):
            if not planner.wants_calibration(record.shape, memory):
                return None
            try:
                got = measure(engine.llm, memory, record, planner, EngineStats(),
                              lambda tokens, start: engine.prefill(tokens, start=start), progress=progress)
            except EngineError:
                memory.clear()
                if engine.lock.stopping:
                    raise Cancelled("gave way to a waiting prompt") from None
                raise
    except EngineClosed:
        return None
    except Cancelled:
        engine.pending_calibration = record  # given way to another prompt, or cancelled: measured later
        return None
    return planner.calibrated(planner.new_calibration(kl=got.kl, top1=got.top1, tokens=got.tokens, kls=(got.kl,),
                                                      sections=len(record.shape.sections.ends)))


def run_on(engine, prompt: PromptShape, *, repeat_penalty: float, cancel=None,
           progress: Callable[[int], None] | None = None):
    """Answer ``prompt`` (a sections-mode prompt of the collection) exactly on ``engine``, recording its
    first answer positions, then :func:`run_pending`. None where no calibration is wanted
    (``ask.compose`` not ``auto``, calibrated already, a model that cannot shift, one section).

    The answer is decoded as questions' answers are (pass ``ask.repeat_penalty``): a small model's
    greedy answer without the penalty soon repeats one line, and positions that only copy the line
    before agree whatever the context, so they would measure composition as closer to exact than
    the answers users read.

    Both steps are background work: a prompt that queues meanwhile runs first, and the step is taken
    up again after it (an exact answer another prompt recorded meanwhile is measured instead), until
    the calibration is done or ``cancel`` fires (:class:`~pipeline.errors.Cancelled`). ``progress(tokens)``
    is told of the tokens computed (prefilled exactly, then composed) as it goes."""
    from ...errors import Cancelled, EngineClosed, EngineError

    if len(prompt) + TOKENS + 1 > engine.n_ctx:
        raise EngineError(f"the calibration prompt has {len(prompt):,} tokens; the context holds {engine.n_ctx:,}")
    while True:
        if engine.pending_calibration is None:
            try:
                engine.generate(prompt, max_tokens=TOKENS, repeat_penalty=repeat_penalty, cancel=cancel, exact=True,
                                preemptible=True, progress=_increments(progress)).read()
            except Cancelled as exc:
                if isinstance(exc, EngineClosed) or (cancel is not None and cancel.cancelled):
                    raise
                continue  # gave way: the waiting prompt runs, then this one again
            if engine.pending_calibration is None:
                return None  # nothing to calibrate on this prompt
        got = run_pending(engine, cancel=cancel, progress=progress)
        if got is not None or engine.pending_calibration is None:
            return got
        if cancel is not None and cancel.cancelled:
            raise Cancelled("cancelled before composition was measured")


def _increments(progress: Callable[[int], None] | None) -> Callable[[int, int], None] | None:
    """A ``progress(done, total)`` of a prefill as ``progress(tokens)`` increments."""
    if progress is None:
        return None
    seen = [0]

    def tell(done: int, total: int) -> None:
        progress(done - seen[0])
        seen[0] = done
    return tell


__all__ = ["Measured", "Recorder", "TOKENS", "compare", "measure", "run_on", "run_pending"]
