"""What callers hand the library, checked where it comes in: text that is Unicode, a ``top_k`` within bounds.

The ask path (:class:`~pipeline.ask.request.AskRequest`), search and ``rag serve`` take
these from users (command-line arguments, JSON bodies, keyword arguments); a value that
cannot be used is an :class:`~pipeline.errors.InputError` that names it, never an
exception from deep inside the engine.
"""

from __future__ import annotations

from .errors import InputError

#: The most hits or passages one call may ask for.
MAX_TOP_K = 1000


def check_text(text: str, what: str) -> str:
    """``text``, or an :class:`InputError` when it cannot be text for a model: it holds a lone
    surrogate (undecodable bytes in a command-line argument, an unpaired ``\\ud800`` in JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid text: character {exc.start + 1} is not Unicode text (invalid UTF-8 "
                         "bytes, or an unpaired surrogate such as \\ud800)") from None
    return text


def check_top_k(top_k: int | None) -> int | None:
    """``top_k`` (None: the setting), or an :class:`InputError` outside 1..:data:`MAX_TOP_K`."""
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool)
                                  and 1 <= top_k <= MAX_TOP_K):
        raise InputError(f"top_k must be between 1 and {MAX_TOP_K} (got {top_k!r})")
    return top_k


__all__ = ["MAX_TOP_K", "check_text", "check_top_k"]
