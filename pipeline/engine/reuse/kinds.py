"""What a model's KV memory allows reuse to do: one kind per model, chosen once.

A kind is a strategy, not a flag: every place that reuses state asks the memory's kind
(:attr:`.memory.Memory.kind`) what it may do, and nothing else tests the model.

* :class:`Attention`: attention-only models. The memory is cut at any position, its
  cells can be moved to other positions (llama.cpp re-rotates the keys), so prompts are
  composed from section states, and sequences share a prefix's cells (several prompts
  decode together).
* :class:`Unshiftable`: attention whose cells cannot be moved (llama.cpp's
  ``llama_memory_can_shift`` says no): cut anywhere, shared between sequences, never composed.
* :class:`Recurrent`: recurrent and hybrid models (Mamba, Qwen3.5/3.6's Gated DeltaNet
  layers). A recurrent state holds everything before it in one vector: it cannot be cut,
  moved, or shared between sequences. Such a memory is kept only when it is exactly a prefix
  of the next prompt ending at a cut; otherwise a state saved exactly at a cut is restored,
  and states are kept in host memory at every cut (checkpoints), so a later question restores
  from wherever its prompt leaves the earlier one.

The kind is read from the GGUF header before the model loads (:func:`kind_of_info`: what
``rag status`` and the section size need without loading it), and from llama.cpp once it
has (:func:`kind_of_model`), which is final.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._llama import Model
    from ..gguf.info import ModelInfo


class MemoryKind:
    """What reuse may do with one model's KV memory (see the module notes)."""

    name = ""
    #: Sections' states may be moved into any prompt (composition).
    composes = False
    #: States are kept in host memory at every cut of a prompt (a memory that cannot be cut).
    checkpoints = False
    #: Sequences can share a prefix's cells (several prompts decoded together).
    shares_prefix = True

    def keepable(self, common: int, held: int) -> int:
        """How much of a memory holding ``held`` tokens a prompt may keep, sharing ``common`` of them up to a
        cut: any prefix, where the memory can be cut."""
        return common

    def __repr__(self) -> str:
        return f"<memory kind {self.name}>"


class Attention(MemoryKind):
    name = "attention"
    composes = True


class Unshiftable(MemoryKind):
    name = "attention (cells cannot move)"


class Recurrent(MemoryKind):
    name = "recurrent"
    checkpoints = True
    shares_prefix = False

    def keepable(self, common: int, held: int) -> int:
        """All of it where it is exactly the shared prefix; else nothing (a recurrent state cannot be cut)."""
        return common if common == held else 0


ATTENTION, UNSHIFTABLE, RECURRENT = Attention(), Unshiftable(), Recurrent()


def kind_of_info(info: ModelInfo) -> MemoryKind:
    """The kind a model's header says it is (before it loads): recurrent where any layer is."""
    return RECURRENT if any(layer.kind == "recurrent" for layer in info.layers) else ATTENTION


def kind_of_model(model: Model) -> MemoryKind:
    """The kind of a loaded model, as llama.cpp reports its memory."""
    from .._llama import composing

    if not model.can_trim:
        return RECURRENT
    return ATTENTION if composing.can_shift(model) else UNSHIFTABLE


__all__ = ["ATTENTION", "Attention", "MemoryKind", "RECURRENT", "Recurrent", "UNSHIFTABLE", "Unshiftable",
           "kind_of_info", "kind_of_model"]
