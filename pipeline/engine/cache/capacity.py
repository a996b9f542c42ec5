"""How much disk the prefix cache may use, and which states go first past it.

The cap
    ``cache.max_gb`` above 0 is a fixed cap. At 0 (the default) the cap follows the disk:
    half of what the cache's file system could give it (its free space plus what the cache
    already holds), less a margin kept free for everything else (the larger of 2 GiB and a
    tenth of the file system). It is read again at every save, so it shrinks as other files
    fill the disk and grows as they are deleted, and the cache's own states never shrink it
    (what it holds is counted back in): at rest the cache holds at most the cap and leaves at
    least the margin free. :func:`cap` is the rule; where the file system cannot be asked,
    the cap is :data:`FALLBACK_BYTES`.

Which states go first
    Past the cap the least useful states are evicted first (:func:`usefulness`): a state is
    worth the prefill it saves (its tokens, per byte of disk it takes) times how often it
    was used (restored, plus one for being there), and that worth fades by half for every
    :data:`HALF_LIFE` seconds since it was last used. So a section state restored by many
    questions outlives one computed once and never restored, and a state nobody has used
    for days goes before one saved a moment ago. Prefix and section states share the
    policy. Between states equally used, the one used longest ago goes first (as LRU).
"""

from __future__ import annotations

import math
import os

from ...disk import space

#: Share of what the file system could give the cache that the automatic cap takes.
SHARE = 0.5
#: Kept free for everything else, at least (bytes), and as a share of the file system's size.
MARGIN_BYTES = 2 * 2**30
MARGIN_SHARE = 0.10
#: The cap where the file system cannot be asked (the former default, 8 GiB).
FALLBACK_BYTES = 8 * 2**30
#: Seconds after which an unused state's worth has halved.
HALF_LIFE = 86_400.0
#: Steps per doubling in which tokens per byte are compared (about 4 % each).
DENSITY_STEPS = 16


def cap(path: str | os.PathLike[str], used: int, *, max_bytes: int = 0) -> int:
    """The bytes a cache in ``path`` that holds ``used`` bytes may hold now: ``max_bytes`` where it
    is set (above 0), else the share of its file system described in the module notes."""
    if max_bytes > 0:
        return int(max_bytes)
    found = space(path)
    if found is None:
        return FALLBACK_BYTES
    free, size = found
    margin = max(MARGIN_BYTES, int(MARGIN_SHARE * size))
    return max(0, int(SHARE * (free + used - margin)))


def usefulness(*, hits: int, n_tokens: int, size: int, last_used: float, now: float) -> float:
    """What keeping a state is worth per byte (see the module notes): the least useful go first.

    Tokens per byte count in steps of :data:`DENSITY_STEPS` per doubling: a state's fixed overhead
    makes a longer state of the same model and type a hair denser, which must not outrank when it was
    used (states saved a second apart would otherwise go longest first, not oldest first), while a
    q8_0 state stays worth about twice its f16 twin."""
    age = max(0.0, now - last_used)
    density = 2.0 ** (round(math.log2(max(n_tokens, 1) / max(size, 1)) * DENSITY_STEPS) / DENSITY_STEPS)
    return (hits + 1) * density * 0.5 ** (age / HALF_LIFE)


__all__ = ["DENSITY_STEPS", "FALLBACK_BYTES", "HALF_LIFE", "MARGIN_BYTES", "MARGIN_SHARE", "SHARE", "cap", "usefulness"]
