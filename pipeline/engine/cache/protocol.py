"""What every state store offers reuse: :class:`StateStore` (the prefix cache on disk, the states kept in
host memory), with its one exact lookup (:class:`ExactLookup`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Protocol, Sequence

if TYPE_CHECKING:
    from .._llama import Model
    from .index import Entry


class StateStore(Protocol):
    """Where saved KV states live: :class:`~.store.PrefixCache` on disk, :class:`~.ram.RamStates` in memory."""

    unavailable: str
    last_error: str
    last_load_seconds: float

    @property
    def read_only(self) -> bool: ...

    def lookup(self, namespace: str, tokens: Sequence[int], *, max_tokens: int | None = None,
               min_tokens: int = 1, lengths: Collection[int] | None = None, count: bool = True) -> Entry | None: ...

    def find(self, namespace: str, tokens: Sequence[int]) -> Entry | None: ...

    def load(self, entry: Entry, model: Model, *, seq: int = 0) -> bool: ...

    def save(self, namespace: str, tokens: Sequence[int], model: Model, *, seq: int = 0) -> Entry | None: ...

    def take_notes(self) -> list[str]: ...


class ExactLookup:
    """The one exact lookup of a store: the state saved for exactly ``tokens``."""

    def find(self, namespace: str, tokens: Sequence[int]) -> Entry | None:
        """The entry holding exactly ``tokens`` (a head, a section, a whole prefix), without counting a
        use or a miss; None where there is none."""
        n = len(tokens)
        if n == 0:
            return None
        return self.lookup(namespace, tokens, max_tokens=n, min_tokens=n,  # type: ignore[attr-defined]
                           lengths={n}, count=False)


__all__ = ["ExactLookup", "StateStore"]
