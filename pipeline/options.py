"""One call's answer settings: the ``[ask]`` configuration with the call's overrides, checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .config import ASK_MODES, AskConfig
from .errors import InputError


def check_text(text: str, what: str) -> str:
    """``text``, or an :class:`InputError` when it cannot be text for a model: it holds a lone
    surrogate (undecodable bytes in a command-line argument, an unpaired ``\\ud800`` in JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid text: character {exc.start + 1} is not Unicode text (invalid UTF-8 "
                         "bytes, or an unpaired surrogate such as \\ud800)") from None
    return text


#: The most hits or passages one call may ask for.
MAX_TOP_K = 1000


def check_top_k(top_k: int | None) -> int | None:
    """``top_k`` (None: the setting), or an :class:`InputError` outside 1..:data:`MAX_TOP_K`."""
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool)
                                  and 1 <= top_k <= MAX_TOP_K):
        raise InputError(f"top_k must be between 1 and {MAX_TOP_K} (got {top_k!r})")
    return top_k


@dataclass(frozen=True)
class AskOptions:
    """What ``ask``/``ask_stream``/``aask``/``chat`` take per call (None: the ``[ask]`` setting).

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
        return cls(temperature=ask.temperature if temperature is None else float(temperature),
                   max_tokens=ask.max_tokens if max_tokens is None else max_tokens,
                   system_prompt=ask.system_prompt if system_prompt is None else str(system_prompt),
                   stop=tuple(s for s in (stop or ()) if s), top_k=top_k or ask.top_k, mode=mode or ask.mode)
