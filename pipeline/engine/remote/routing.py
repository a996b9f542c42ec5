"""Prefix-aware routing over several generator servers: consistent hashing of a prompt's leading documents.

A server reuses only what its own slot holds, so prompts that start with the same
documents should go to the same server. The route key is a hash of the prompt's
head and first document (its tokens up to the first boundary; the whole prefix, or
its first 256 tokens, where there are no boundaries). Keys are placed on a hash ring
with many virtual points per server: adding a server moves only the keys that now
fall to it (about 1/n of them), and removing one moves only its own. The preference
order for a key is the ring walked clockwise from it, each server once: the first is
where the prefix lives, the next ones are where it fails over to.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Sequence

from ...records import PromptShape

VNODES = 160
_NO_BOUNDARY_TOKENS = 256


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def route_key(prompt: PromptShape) -> bytes:
    """The bytes a prompt is routed by: its tokens up to the end of its first document (its first cut)."""
    end = prompt.cuts[0] if prompt.cuts else min(len(prompt), _NO_BOUNDARY_TOKENS)
    return b",".join(str(t).encode() for t in prompt.tokens[:end])


class HashRing:
    """Servers (by name) on a consistent-hash ring."""

    def __init__(self, names: Sequence[str], *, vnodes: int = VNODES):
        self.names = list(names)
        points = sorted((_h(f"{name}#{i}".encode()), name) for name in self.names for i in range(vnodes))
        self._hashes = [p for p, _ in points]
        self._owners = [n for _, n in points]

    def preference(self, key: bytes) -> list[str]:
        """Every server once, starting with the key's owner, clockwise."""
        if not self.names:
            return []
        start = bisect.bisect(self._hashes, _h(key)) % len(self._hashes)
        out: list[str] = []
        for i in range(len(self._hashes)):
            name = self._owners[(start + i) % len(self._hashes)]
            if name not in out:
                out.append(name)
                if len(out) == len(self.names):
                    break
        return out

    def owner(self, key: bytes) -> str:
        return self.preference(key)[0]


__all__ = ["HashRing", "route_key"]
