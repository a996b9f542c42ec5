"""Where a model's tensors live: llama.cpp's expert-offload flags as data.

llama.cpp's command line has three ways to keep mixture-of-experts weights in CPU
memory while the rest of the model sits on the GPU: ``--cpu-moe`` (every layer's
experts), ``--n-cpu-moe N`` (the experts of the first N layers) and
``-ot REGEX=BUFFER`` (any tensor whose name matches). All three end up as one
ordered list of (pattern, buffer type) pairs handed to the loader, which tries the
patterns in order with ``std::regex_search`` and takes the first that matches.

This module builds that list as plain data (:class:`Override`) and predicts what
the loader will do with it (:func:`planned_tensors`). It never imports llama_cpp:
turning overrides into the C structure is :mod:`pipeline.engine._llama`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError

#: llama.cpp's ``LLM_FFN_EXPS_REGEX``: the routed-expert weight tensors of a layer.
EXPERT_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"

#: The buffer type name of host memory, as llama.cpp's ``-ot`` and logs spell it.
CPU = "CPU"


@dataclass(frozen=True)
class Override:
    """Tensors whose name matches ``pattern`` (``re.search``) go to buffer type ``buffer``."""

    pattern: str
    buffer: str

    def __post_init__(self) -> None:
        if not self.pattern:
            raise ConfigError("A tensor override needs a non-empty pattern.")
        if not self.buffer:
            raise ConfigError(f"The tensor override {self.pattern!r} names no buffer type.")
        _compile(self.pattern)

    def __str__(self) -> str:
        return f"{self.pattern}={self.buffer}"


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"The tensor override pattern '{pattern}' is not a valid regular expression: {exc}.") from None


def layer_experts_pattern(layer: int) -> str:
    """llama.cpp's ``llm_ffn_exps_block_regex``: the expert tensors of one layer.

    ``blk\\.1\\.ffn_...`` cannot match layer 10: the ``\\.`` that starts the expert
    pattern anchors the end of the layer number.
    """
    if layer < 0:
        raise ConfigError(f"A layer index cannot be negative (got {layer}).")
    return rf"blk\.{layer}{EXPERT_PATTERN}"


def cpu_moe(buffer: str = CPU) -> list[Override]:
    """``--cpu-moe``: the experts of every layer in ``buffer`` (host memory by default)."""
    return [Override(EXPERT_PATTERN, buffer)]


def n_cpu_moe(
    n: int, n_layers: int, *, which: Literal["first", "last"] = "first", buffer: str = CPU
) -> list[Override]:
    """The experts of the first (llama.cpp's ``--n-cpu-moe N``) or last ``n`` layers in ``buffer``.

    ``n`` larger than ``n_layers`` is clamped, as llama.cpp does in effect (patterns
    for layers that do not exist match nothing). One override per layer, in layer order.
    """
    if n < 0:
        raise ConfigError(f"The number of layers with experts on the CPU cannot be negative (got {n}).")
    if n_layers < 0:
        raise ConfigError(f"A model cannot have a negative number of layers (got {n_layers}).")
    n = min(n, n_layers)
    if which == "first":
        layers: Iterable[int] = range(n)
    elif which == "last":
        layers = range(n_layers - n, n_layers)
    else:
        raise ConfigError(f"which must be 'first' or 'last', not {which!r}.")
    return [Override(layer_experts_pattern(i), buffer) for i in layers]


def parse_override(text: str) -> list[Override]:
    """Parse one ``-ot`` / ``--override-tensor`` value: ``REGEX=BUFFER[,REGEX=BUFFER...]``.

    As in llama.cpp, the list is split on every comma (so a pattern cannot contain
    one) and each item on its first ``=``. Buffer names are kept as written
    (``CPU``, ``CUDA0``...); whether this build knows them is checked at load time.
    """
    out: list[Override] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ConfigError(f"The tensor override {text!r} has an empty item.")
        pattern, sep, buffer = item.partition("=")
        if not sep:
            raise ConfigError(f"The tensor override {item!r} is not of the form REGEX=BUFFER.")
        pattern, buffer = pattern.strip(), buffer.strip()
        if not pattern:
            raise ConfigError(f"The tensor override {item!r} has an empty pattern.")
        if not buffer:
            raise ConfigError(f"The tensor override {item!r} names no buffer type.")
        out.append(Override(pattern, buffer))
    return out


def planned_tensors(tensor_names: Iterable[str], overrides: Sequence[Override]) -> dict[str, str]:
    """The tensors the loader will override, and to which buffer type.

    Same rule as llama.cpp's loader: for each tensor the patterns are tried in order
    with a search (not a full match) and the first that matches decides. Tensors no
    pattern matches are left out.
    """
    compiled = [(_compile(o.pattern), o.buffer) for o in overrides]
    plan: dict[str, str] = {}
    for name in tensor_names:
        for rx, buffer in compiled:
            if rx.search(name):
                plan[name] = buffer
                break
    return plan
