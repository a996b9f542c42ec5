"""The store: Chroma vectors and the SQLite catalog (documents, chunks, BM25) kept in agreement."""
