"""What one engine's KV memory holds, as reuse sees it: the tokens of sequence 0, and how they were made."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from .kinds import ATTENTION, MemoryKind, kind_of_model

if TYPE_CHECKING:
    from .._llama import Model
    from ..cache.index import Entry
    from ..cache.protocol import StateStore


class Memory:
    """Sequence 0 of one llama.cpp context: the tokens it holds, position by position.

    ``composed`` is how many leading tokens a composition made (0: all computed exactly):
    prefix reuse takes only exactly computed memory, and a composed prompt keeps only what
    a composition made. ``model`` is the loaded model, None until its owner (the engine)
    loads it (:meth:`attach`): an unloaded model holds nothing. :attr:`kind` is what reuse may
    do with it (:mod:`.kinds`): ``expected()`` until the model loads (its header's word), then
    llama.cpp's. Not thread-safe: the owner calls it within its turn; others read :meth:`snapshot`.
    """

    def __init__(self, *, expected: Callable[[], MemoryKind] = lambda: ATTENTION) -> None:
        self.model: Model | None = None
        self.tokens: list[int] = []
        self.composed = 0
        self._expected = expected
        self._kind: MemoryKind | None = None  # the loaded model's

    def attach(self, model: Model) -> None:
        """The model is loaded: its memory is empty, and its kind is now llama.cpp's (read once)."""
        self.model, self.tokens, self.composed = model, [], 0
        self._kind = kind_of_model(model)

    def detach(self) -> None:
        """The model is freed: nothing is held."""
        self.model, self.tokens, self.composed = None, [], 0

    @property
    def kind(self) -> MemoryKind:
        return self._kind if self._kind is not None else self._expected()

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def _loaded(self) -> Model:
        if self.model is None:
            raise RuntimeError("the model is not loaded")
        return self.model

    def snapshot(self) -> Memory:
        """A copy of what it holds, for a look beside a running prompt (the model shared, never used)."""
        out = Memory(expected=self._expected)
        out.model, out.tokens, out.composed, out._kind = self.model, list(self.tokens), self.composed, self._kind
        return out

    @property
    def exact(self) -> Sequence[int]:
        """What prefix reuse may take: nothing where a composition made the memory."""
        return () if self.composed else self.tokens

    def clear(self) -> None:
        if self.model is not None:
            self.model.clear()
        self.tokens = []
        self.composed = 0

    def cut(self, n: int) -> bool:
        """Keep the first ``n`` tokens; False (and the memory unchanged) where llama.cpp cannot cut there."""
        if n >= len(self.tokens):
            return True
        if not self._loaded().trim(n):
            return False
        del self.tokens[n:]
        self.composed = min(self.composed, n)
        return True

    def restore(self, store: StateStore, entry: Entry, tokens: Sequence[int]) -> bool:
        """Load ``entry`` (a saved state of ``tokens[:entry.n_tokens]``) in place of what the memory holds;
        False (and the memory empty) when the state failed its checks."""
        self.clear()
        if not store.load(entry, self._loaded()):
            self.clear()
            return False
        self.tokens = list(tokens[:entry.n_tokens])
        return True

    def synchronize(self) -> None:
        """Wait for pending decodes: llama.cpp books their time when they are synchronised."""
        self._loaded().synchronize()

    def save(self, store: StateStore, namespace: str) -> Entry | None:
        """Save what the memory holds now (the store checks that the sequence ends where it should)."""
        return store.save(namespace, self.tokens, self._loaded())


__all__ = ["Memory"]
