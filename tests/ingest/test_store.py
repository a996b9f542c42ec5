"""The store below ingest: Chroma batch limits and the commit journal."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_writes_are_split_to_chromas_batch_limit(tmp_path):
    """A document with more chunks than Chroma accepts in one call is written in pieces, then committed."""
    import numpy as np

    from pipeline.records import Chunk, DocumentRecord
    from pipeline.store.store import Store

    with Store(tmp_path / "store", "big") as store:
        limit = store._chroma.get_max_batch_size()
        n = limit + 300
        store.ensure_collection(embedder="e", embedder_id="id", dim=8, chunk_size=16, chunk_overlap=0)
        chunks = [Chunk(f"chunk {i}", i, None, 0, 7, 2) for i in range(n)]
        vectors = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)
        doc = DocumentRecord("/big.txt", "f" * 64, 1, 1, "text")
        store.write_document(doc, chunks, vectors)
        assert store.chunk_count() == n and store.catalog.totals("big")[1] == n
        assert store.catalog.pending("big") == []
