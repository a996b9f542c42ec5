"""One question and every per-call option, checked once: :class:`AskRequest`, and the options it resolves to.

The CLI, ``rag serve`` and :class:`~pipeline.api.Pipeline` build an :class:`AskRequest`
from what they were given (flags, a JSON body, keyword arguments); the ask path
(:mod:`.flow`) takes it down to retrieval, packing and the engine unchanged. Options
left at None mean "the ``[ask]`` setting": :meth:`AskRequest.options` lays them over the
configuration as an :class:`AskOptions`. A value that cannot be used is refused when the
request is made (:class:`~pipeline.errors.InputError`), so nothing further down checks it
again; the ``[ask]`` settings themselves are checked once, when the configuration loads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..config import ASK_MODES, AskConfig
from ..errors import InputError
from ..inputs import check_text, check_top_k

if TYPE_CHECKING:
    from ..engine.context_lock import CancelToken
    from .progress import PrefillProgress
    from .started import Start

Paths = "str | os.PathLike | Sequence[str | os.PathLike] | None"


@dataclass(frozen=True)
class AskOptions:
    """What ``ask``/``ask_stream``/``aask``/``chat`` take per call, resolved: each the call's value or
    the ``[ask]`` setting.

    ``stop`` strings are added to the default stops (the chat template's turn markers
    and the guard against invented "Question:" turns; see :mod:`.stops`).
    """

    temperature: float
    max_tokens: int
    system_prompt: str
    stop: tuple[str, ...] = ()
    top_k: int = 8
    mode: str = "auto"

    @classmethod
    def resolve(cls, ask: AskConfig, *, temperature: float | None = None, max_tokens: int | None = None,
                system_prompt: str | None = None, stop: str | Sequence[str] | None = None,
                top_k: int | None = None, mode: str | None = None) -> "AskOptions":
        """The call's options (checked) over the ``[ask]`` settings."""
        given = _checked(temperature=temperature, max_tokens=max_tokens, system_prompt=system_prompt, stop=stop,
                         top_k=top_k, mode=mode)
        return cls(temperature=ask.temperature if given["temperature"] is None else given["temperature"],
                   max_tokens=ask.max_tokens if given["max_tokens"] is None else given["max_tokens"],
                   system_prompt=ask.system_prompt if given["system_prompt"] is None else given["system_prompt"],
                   stop=given["stop"], top_k=given["top_k"] or ask.top_k, mode=given["mode"] or ask.mode)


@dataclass(frozen=True)
class AskRequest:
    """A question, what to answer it from, and how: every option of one ``ask`` call.

    ``doc`` names ingested documents and ``source`` documents or folders (both empty: the
    whole collection). ``history`` (earlier ``{"role": "user" | "assistant", "content"}``
    turns) makes it a follow-up, and ``chat_id`` names the conversation whose turns are kept
    on disk (see :mod:`.chat`; its turns are read from there unless ``history`` is given).
    ``cancel`` stops the call from another thread; ``progress`` receives a
    :class:`~.progress.PrefillProgress` after each prefilled piece; ``start`` is where the
    answer's ``start_to_first_token_seconds`` counts from (a :class:`~.started.Start`; None:
    the call). The other fields are the call's :class:`AskOptions`, None for the ``[ask]`` setting.
    """

    question: str
    doc: tuple[str | os.PathLike, ...] = ()
    source: tuple[str | os.PathLike, ...] = ()
    mode: str | None = None
    top_k: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    system_prompt: str | None = None
    stop: tuple[str, ...] = ()
    history: tuple[dict, ...] | None = None
    chat_id: str | None = None
    cancel: "CancelToken | None" = field(default=None, compare=False, repr=False)
    progress: "Callable[[PrefillProgress], None] | None" = field(default=None, compare=False, repr=False)
    start: "Start | None" = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise InputError("the question is empty")
        check_text(self.question, "the question")
        for turn in self.history or ():
            check_text(turn.get("content", "") if isinstance(turn, dict) else "", "an earlier turn")
        given = _checked(temperature=self.temperature, max_tokens=self.max_tokens,
                         system_prompt=self.system_prompt, stop=self.stop, top_k=self.top_k, mode=self.mode)
        given.update(doc=_listed(self.doc), source=_listed(self.source),
                     history=None if self.history is None else tuple(self.history))
        for name, value in given.items():
            object.__setattr__(self, name, value)

    @classmethod
    def make(cls, question: "str | AskRequest", **options: Any) -> "AskRequest":
        """``question`` with ``options`` (keyword arguments of :meth:`Pipeline.ask`); a request given as the
        question is taken as it is (with no options beside it)."""
        if isinstance(question, AskRequest):
            if any(v is not None for v in options.values()):
                raise InputError("options go into the AskRequest, not beside it")
            return question
        return cls(question, **{k: v for k, v in options.items() if v is not None})

    def options(self, ask: AskConfig) -> AskOptions:
        """This call's options over the ``[ask]`` settings."""
        return AskOptions(temperature=ask.temperature if self.temperature is None else self.temperature,
                          max_tokens=ask.max_tokens if self.max_tokens is None else self.max_tokens,
                          system_prompt=ask.system_prompt if self.system_prompt is None else self.system_prompt,
                          stop=self.stop, top_k=self.top_k or ask.top_k, mode=self.mode or ask.mode)

    def replace(self, **changes: Any) -> "AskRequest":
        return dataclasses.replace(self, **changes)

    @property
    def text(self) -> str:
        """What follows "Question: " in the prompt: the question, after the earlier turns of a follow-up."""
        if not self.history:
            return self.question
        from .chat import transcript

        return transcript(self.history, self.question)

    @property
    def query(self) -> str:
        """What retrieval looks for: the question, or for a follow-up a standalone condensed query."""
        if not self.history:
            return self.question
        from .chat import condense

        return condense(self.history, self.question)

    @property
    def whole_document(self) -> bool:
        """Whether it names documents only (``--doc``), so that one document may be packed whole."""
        return bool(self.doc) and not self.source


def _listed(value) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, (str, os.PathLike)) else tuple(value)


def _checked(*, temperature, max_tokens, system_prompt, stop, top_k, mode) -> dict:
    """The per-call options, refused where they cannot be used (the one check of each), ``stop`` as a tuple."""
    if temperature is not None and not (isinstance(temperature, (int, float)) and 0.0 <= temperature <= 5.0):
        raise InputError(f"temperature must be a number between 0 and 5 (got {temperature!r})")
    if max_tokens is not None and not (isinstance(max_tokens, int) and 1 <= max_tokens <= 1_000_000):
        raise InputError(f"max_tokens must be a positive number of tokens (got {max_tokens!r})")
    check_top_k(top_k)
    if mode is not None and mode not in ASK_MODES:
        raise InputError(f"mode must be one of {', '.join(ASK_MODES)}, got {mode!r}")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not all(isinstance(s, str) for s in stop):
        raise InputError("stop must be a string or a list of strings")
    for s in stop or ():
        check_text(s, "a stop string")
    if system_prompt is not None:
        if "\0" in check_text(str(system_prompt), "the system prompt"):
            raise InputError("the system prompt must not contain NUL characters (the prompt layout's marker)")
    return {"temperature": None if temperature is None else float(temperature), "max_tokens": max_tokens,
            "system_prompt": None if system_prompt is None else str(system_prompt),
            "stop": tuple(s for s in (stop or ()) if s), "top_k": top_k, "mode": mode}


__all__ = ["AskOptions", "AskRequest", "Paths"]
