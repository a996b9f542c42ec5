"""Exact nearest neighbours over the catalog's vectors: a small collection's dense search without Chroma.

Each chunk's embedding is kept in the catalog beside its text, written in the commit's own
transaction (see :mod:`.schema`, version 5). Starting Chroma in a new process (importing
``chromadb``, opening its client and its index) took most of a second on a 2-core machine,
where ranking a few thousand vectors by cosine similarity takes milliseconds. So where the
chunks searched number at most :data:`EXACT_LIMIT` and every one of them has its vector in the
catalog, :func:`nearest` reads them there and ranks them exactly, as Chroma's cosine space
would (similarity ``1 - distance``); above that, or while chunks committed before the catalog
kept vectors remain (``rag ingest`` copies theirs from Chroma), Chroma's index answers. The
catalog holds committed chunks only, so nothing needs filtering here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..records import StoredChunk

if TYPE_CHECKING:
    import numpy as np

    from .catalog import Catalog

#: The most chunks one dense search ranks from the catalog (about 6 MB of 384-dimension vectors,
#: a few milliseconds of arithmetic); larger searches go to Chroma's index.
EXACT_LIMIT = 4096


def encode(vectors: "np.ndarray") -> list[bytes]:
    """One vector per row as the catalog keeps it: float32, little-endian."""
    import numpy as np

    rows = np.ascontiguousarray(np.asarray(vectors, dtype="<f4"))
    return [row.tobytes() for row in rows]


def decode(blobs: Sequence[bytes]) -> "np.ndarray":
    """The vectors ``encode`` wrote, as one float32 matrix (one row each)."""
    import numpy as np

    if not blobs:
        return np.zeros((0, 0), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), -1).astype(np.float32)


def nearest(catalog: "Catalog", collection: str, vector: "np.ndarray", *, limit: int,
            source: str | Sequence[str] | None = None) -> list[tuple[StoredChunk, float]] | None:
    """The ``limit`` committed chunks (of ``source``) nearest to ``vector`` by cosine similarity, best
    first (ties by chunk id, as the Chroma path orders them); None where the catalog cannot answer
    alone (more than :data:`EXACT_LIMIT` chunks, or some without their vector)."""
    import numpy as np

    total, complete = catalog.vector_coverage(collection, source)
    if total > EXACT_LIMIT or not complete:
        return None
    rows = sorted(catalog.vectors(collection, source=source))
    if not rows or limit <= 0:
        return []
    ids = [cid for cid, _ in rows]
    matrix = decode([blob for _, blob in rows])
    q = np.asarray(vector, dtype=np.float32).reshape(-1)
    if matrix.shape[1] != q.shape[0]:
        return None  # vectors of another width: the Chroma path reports what is wrong
    norms = np.linalg.norm(matrix, axis=1) * float(np.linalg.norm(q))
    sims = np.divide(matrix @ q, norms, out=np.zeros(len(ids), dtype=np.float32), where=norms > 0)
    order = np.argsort(-sims, kind="stable")[:limit]  # stable: equal similarities keep the ids' order
    chunks = catalog.chunks_by_id(collection, [ids[i] for i in order])
    # A chunk replaced since its vector was read (another process's commit) is left out.
    return [(chunks[ids[i]], float(sims[i])) for i in order if ids[i] in chunks]


__all__ = ["EXACT_LIMIT", "decode", "encode", "nearest"]
