"""One call's answer settings: the ``[ask]`` configuration with the call's overrides, checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..config import ASK_MODES, AskConfig
from ..errors import InputError


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
        if top_k is not None and not (isinstance(top_k, int) and 1 <= top_k <= 1000):
            raise InputError(f"top_k must be between 1 and 1000 (got {top_k!r})")
        if mode is not None and mode not in ASK_MODES:
            raise InputError(f"mode must be one of {', '.join(ASK_MODES)}, got {mode!r}")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and not all(isinstance(s, str) for s in stop):
            raise InputError("stop must be a string or a list of strings")
        return cls(temperature=ask.temperature if temperature is None else float(temperature),
                   max_tokens=ask.max_tokens if max_tokens is None else max_tokens,
                   system_prompt=ask.system_prompt if system_prompt is None else str(system_prompt),
                   stop=tuple(s for s in (stop or ()) if s), top_k=top_k or ask.top_k, mode=mode or ask.mode)
