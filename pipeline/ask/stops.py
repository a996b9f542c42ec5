"""Where an answer ends: stop tokens from the chat template, stop strings, and the new-turn guard.

A chat model ends its turn with an end-of-generation token, which llama.cpp knows;
but templates also mark turns with tokens the vocabulary does not flag as such
(``<end_of_turn>``, ``<|im_start|>``), and small or base models go on to write the
next turn themselves ("Question: … Answer: …"). The defaults stop at the template's
end-of-turn and start-of-turn tokens and, as text, at a new "Question:" line, the
layout of our own prompts (see :mod:`.prompt`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

# Our prompt ends "Question: …" then the answer; a model that starts such a line is inventing a turn.
TURN_GUARD = ("\nQuestion:", "\nDocuments:")

_A, _B = "\x00ANSWER\x00", "\x00NEXT\x00"


@dataclass(frozen=True)
class Stops:
    """Tokens and strings that end an answer."""

    tokens: frozenset[int] = frozenset()
    strings: tuple[str, ...] = ()

    def with_strings(self, extra: Iterable[str]) -> "Stops":
        return Stops(self.tokens, tuple(dict.fromkeys([*self.strings, *(s for s in extra if s)])))


def template_stops(engine) -> Stops:
    """The chat template's end-of-turn and next-turn markers as stop tokens (and strings), plus the guard."""
    try:
        rendered = engine.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                  {"role": "assistant", "content": _A}, {"role": "user", "content": _B}],
                                 add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this shape: the guard still applies
        return Stops(strings=TURN_GUARD)
    if rendered is None:
        return Stops(strings=TURN_GUARD)  # no template (or a generator that renders none itself)
    between = rendered.partition(_A)[2].partition(_B)[0]  # e.g. "<|im_end|>\n<|im_start|>user\n"
    tokens, strings = set(), []
    for marker in _turn_markers(between):
        strings.append(marker)
        ids = engine.tokenize(marker, special=True)
        if len(ids) == 1 and marker[0] in "<[":  # a control token renders as no text: stop on its id
            tokens.add(ids[0])
    return Stops(frozenset(tokens), tuple(dict.fromkeys([*strings, *TURN_GUARD])))


def _turn_markers(between: str) -> list[str]:
    """The markup that ends a turn and starts the next, up to the next turn's role: ``<|im_end|>`` and
    ``<|im_start|>`` (ChatML), ``<|end|>`` and ``<|start|>`` (harmony, where the markers are not on lines
    of their own), never what follows the role (harmony's ``<|message|>``)."""
    out = []
    for piece in re.split(r"\n|(?=<)|(?<=>)", between):
        head, role, _ = piece.partition("user")
        if head.strip():
            out.append(head.strip())
        if role:
            break
    return out


def until_stop(pieces: Iterable[str], stops: Sequence[str]) -> Iterator[str]:
    """``pieces`` up to (not including) the first stop string; a stop split across pieces is caught.

    Text that could be the start of a stop string is held back until it cannot be (only that:
    the rest is passed on at once, so the first words reach the reader with the first tokens). The
    new-turn guard applies only once the answer has begun: a model that first repeats
    the question ("Question: …" on a line of its own) has that line dropped instead.
    """
    if not stops:
        yield from pieces
        return
    guard = [s.lstrip("\n") for s in stops if s in TURN_GUARD]
    buf, started = "", False
    for piece in pieces:
        buf += piece
        if not started:
            lead = buf.lstrip()
            if not lead or any(g.startswith(lead[:len(g)]) for g in guard) and "\n" not in lead:
                continue  # nothing yet, or maybe an echoed "Question: …" line: wait for its end
            if any(lead.startswith(g) for g in guard):
                buf = lead.partition("\n")[2]  # drop the echoed question line
                if not buf.strip():
                    buf = ""
                    continue
            started = True
            buf = buf.lstrip()
        hits = [i for i in (buf.find(s) for s in stops) if i >= 0]
        if hits:
            if min(hits):
                yield buf[:min(hits)]
            return
        cut = len(buf) - _stop_start(buf, stops)
        if cut > 0:
            yield buf[:cut]
            buf = buf[cut:]
    if buf and started or buf.strip():
        yield buf


def _stop_start(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of ``text`` that a stop string starts with (0: none)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
