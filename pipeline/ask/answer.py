"""What ``ask`` returns: the answer, its sources and figures, and the stream that produces it.

An :class:`AnswerStream` yields the text as the model writes it and holds the engine while
it is iterated; :class:`Answer` is the finished value (``to_dict`` is the JSON of
``rag ask --json``); :class:`AskStats` adds to the engine's figures how the prompt was packed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ..engine.context_lock import CancelToken
from ..engine.contract import EngineStats

if TYPE_CHECKING:
    from ..records import Prompt
    from .started import Start
    from ..engine.contract import Generation


@dataclass
class AskStats(EngineStats):
    """The engine's figures for one answer, and how its prompt was packed.

    ``mode`` is "whole" (every document of the selection, whole), "sections" (the fixed
    sections chosen for this question) or "passages"; ``sections`` lists what was packed
    (document number, source, section, pages, tokens); ``cached_tokens`` is how much of
    the prompt was reused, and ``reuse_lost`` says why, where less than the whole prefix was.

    ``start_to_first_token_seconds`` is the wait a person sees: from the start named by
    ``start_point`` to the first piece of answer text (to the end, for an answer with none);
    "process" for ``rag ask`` (the command's start, read from the kernel: the interpreter,
    the imports, retrieval, loading the models and ``ttft_seconds`` all count), "call" for
    :meth:`~pipeline.api.Pipeline.ask` and its kin (retrieval, packing, a model load and
    ``ttft_seconds``), "request" for ``rag serve`` (from the request's arrival). None for
    answers decoded together (:meth:`~pipeline.api.Pipeline.ask_many`), which stream nothing.
    """

    mode: str = ""
    sections: list[dict] = field(default_factory=list)
    reuse_lost: str = ""
    start_to_first_token_seconds: float | None = None
    start_point: str = ""


@dataclass
class Answer:
    """An answer with the numbered sources it may cite as [1] or [1, p. 3], and the engine's figures."""

    question: str
    text: str
    sources: list[dict]
    stats: AskStats
    dropped_passages: int = 0
    truncated: bool = False
    notes: list[str] | None = None
    retrieval: dict[str, float] | None = None  # seconds per retrieval stage (see Pipeline.search)

    def to_dict(self) -> dict:
        return {"question": self.question, "text": self.text, "sources": self.sources,
                "stats": self.stats.to_dict(), "dropped_passages": self.dropped_passages,
                "truncated": self.truncated, "notes": list(self.notes or []),
                "retrieval_seconds": {k: round(v, 6) for k, v in (self.retrieval or {}).items()}}


class AnswerStream:
    """Text pieces as the model writes them; ``answer`` is complete once iteration ends.

    Iterating holds the engine (other prompts wait, first come first served) from the
    first piece until the stream is exhausted, closed or garbage-collected: use it in a
    ``with`` block, or call :meth:`close`, to give the engine back at a known moment.
    The answer ends at the first stop string (``stops``), which is not part of it.
    """

    def __init__(self, question: str, prompt: "Prompt", generation: "Generation", notes: list[str],
                 retrieval: dict[str, float] | None = None,
                 finish: Callable[[AskStats], None] | None = None, *, stops: Sequence[str] = (),
                 cancel: CancelToken | None = None, start: "Start | None" = None):
        self.question = question
        self.prompt = prompt
        self.cancel_token = cancel or CancelToken()
        self._generation = generation
        self._notes = notes
        self._retrieval = retrieval
        self._finish = finish
        self._stops = tuple(stops)
        self._start = start
        # Filled by the iterator, which holds no reference back to the stream: a stream dropped
        # half-way is freed (and gives the engine back) at once, not at the next cycle collection.
        self._result: dict = {"callbacks": []}
        self._iter: Iterator[str] | None = None

    @property
    def answer(self) -> "Answer | None":
        return self._result.get("answer")

    @property
    def sources(self) -> list[dict]:
        return self.prompt.sources

    def __iter__(self) -> Iterator[str]:
        if self._iter is None:
            self._iter = _pieces(self.question, self.prompt, self._generation, self._stops, self._notes,
                                 self._retrieval, self._finish, self._result, self._start)
        return self._iter

    def result(self) -> Answer:
        for _ in self:
            pass
        if self.answer is None:
            from ..errors import Cancelled

            raise Cancelled("the stream was closed before the answer was complete")
        return self.answer

    def on_complete(self, callback: Callable[[Answer], None]) -> None:
        """Call ``callback(answer)`` once the answer is complete (not if it is cancelled or fails)."""
        self._result["callbacks"].append(callback)

    def cancel(self) -> None:
        """Stop generating, from any thread: a waiting prompt leaves the queue, a running prefill or
        decode stops within one micro-batch (iteration raises :class:`~pipeline.errors.Cancelled`)."""
        self.cancel_token.cancel()

    def close(self) -> None:
        """Stop (if running) and give the engine back."""
        if self._iter is not None:
            self._iter.close()
        self._generation.close()

    def __enter__(self) -> "AnswerStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pieces(question: str, prompt: "Prompt", generation: "Generation", stops: tuple[str, ...], notes: list[str],
            retrieval, finish, result: dict, start: "Start | None" = None) -> Iterator[str]:
    """An :class:`AnswerStream`'s pieces up to the first stop string; the answer lands in ``result``.
    The wait from ``start`` to the first piece goes into the answer's figures."""
    from .citations import Renumbering
    from .stops import until_stop

    parts: list[str] = []
    stats = generation.stats

    def model_text() -> Iterator[str]:
        for piece in until_stop(generation, stops):
            if start is not None and not parts and piece:
                stats.start_to_first_token_seconds, stats.start_point = start.seconds(), start.point
            if piece:
                parts.append(piece)
            yield piece

    try:  # the citations as the sources number them (the same text complete() makes of the whole)
        yield from Renumbering(prompt.citations).stream(model_text())
    finally:
        generation.close()  # a stop string ends it early: the engine is given back now
    if start is not None and stats.start_to_first_token_seconds is None:  # no text at all: the wait was to the end
        stats.start_to_first_token_seconds, stats.start_point = start.seconds(), start.point
    result["answer"] = answer = complete(question, prompt, "".join(parts), generation.stats, notes, retrieval,
                                         finish)
    for callback in result["callbacks"]:
        callback(answer)


def complete(question: str, prompt: "Prompt", text: str, stats: AskStats, notes: list[str],
             retrieval: dict[str, float] | None, finish: Callable[[AskStats], None] | None) -> Answer:
    """The finished answer to ``question`` (streamed or decoded with others) from the model's ``text``:
    ``finish`` completes the figures (why reuse was lost), the prompt gives the sources (and the
    citations are numbered as they are), the engine's notes follow the packer's."""
    from .citations import renumber

    if finish is not None:
        finish(stats)
    return Answer(question, renumber(text, prompt.citations).strip(), prompt.sources, stats, prompt.dropped,
                  prompt.truncated, notes + stats.notes, retrieval)
